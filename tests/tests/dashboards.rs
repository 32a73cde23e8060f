//! Structural checks of the Grafana dashboards in `dashboards/` (no server needed): they
//! import as the README says (schemaVersion, a `datasource` variable of type `datasource`
//! used by every panel and target, the `agent` variable from
//! `label_values(uctel_collector_frames_received_total, agent)`, on the host dashboard
//! `label_values(node_load1, agent)` so that it works on remote-written data alone), every panel has queries,
//! ids and grid positions are sane, and every variable a query uses is defined.
//! The queries themselves are evaluated against a real Prometheus in `e2e.rs`.

use std::collections::HashSet;

use serde_json::Value;
use uctel_tests::dashboards;

#[test]
fn there_are_the_two_dashboards() {
    let names: Vec<String> = dashboards::files()
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(
        names,
        vec!["uctel-host-overview.json", "uctel-pipeline-health.json"]
    );
}

#[test]
fn dashboards_are_importable() {
    let mut uids = HashSet::new();
    for path in dashboards::files() {
        let d = dashboards::load(&path);
        let name = path.display().to_string();
        let schema = d.get("schemaVersion").and_then(Value::as_u64).unwrap_or(0);
        assert!(schema >= 36, "{name}: schemaVersion {schema}");
        let uid = d.get("uid").and_then(Value::as_str).unwrap_or("");
        assert!(!uid.is_empty() && uid.len() <= 40, "{name}: uid {uid:?}");
        assert!(uids.insert(uid.to_owned()), "{name}: duplicate uid {uid}");
        assert!(
            d.get("id").is_some_and(Value::is_null),
            "{name}: id must be null for import"
        );
        assert!(
            d.get("title").and_then(Value::as_str).is_some(),
            "{name}: no title"
        );

        let vars = d
            .pointer("/templating/list")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let ds = vars
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some("datasource"))
            .unwrap_or_else(|| panic!("{name}: no datasource variable"));
        assert_eq!(ds.get("type").and_then(Value::as_str), Some("datasource"));
        assert_eq!(ds.get("query").and_then(Value::as_str), Some("prometheus"));
        let agent = vars
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some("agent"))
            .unwrap_or_else(|| panic!("{name}: no agent variable"));
        assert_eq!(agent.get("type").and_then(Value::as_str), Some("query"));
        // The pipeline dashboard lists agents the collector knows; the host dashboard those
        // with host metrics, a series that remote-write delivers too (no collector
        // self-metric is needed, so it works on a Mimir or VictoriaMetrics fed by
        // remote-write alone).
        let want = if name.ends_with("uctel-host-overview.json") {
            "label_values(node_load1, agent)"
        } else {
            "label_values(uctel_collector_frames_received_total, agent)"
        };
        assert_eq!(
            agent.get("definition").and_then(Value::as_str),
            Some(want),
            "{name}"
        );
        assert_eq!(agent.get("includeAll").and_then(Value::as_bool), Some(true));
        // `.+`, not `.*`: "All" then means every series *with* an agent label, so series
        // scraped from an agent's own /metrics (no `agent` label) do not show as agent "".
        assert_eq!(agent.get("allValue").and_then(Value::as_str), Some(".+"));

        let ds_ref = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
        let defined: HashSet<String> = dashboards::variables(&d)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let mut ids = HashSet::new();
        let panels = dashboards::panels(&d);
        assert!(panels.len() >= 10, "{name}: only {} panels", panels.len());
        for p in &panels {
            let title = p.get("title").and_then(Value::as_str).unwrap_or("");
            assert!(!title.is_empty(), "{name}: a panel without title");
            let id = p.get("id").and_then(Value::as_u64).unwrap_or(0);
            assert!(ids.insert(id), "{name}: duplicate panel id {id}");
            assert_eq!(p.get("datasource"), Some(&ds_ref), "{name}/{title}");
            let g = p
                .get("gridPos")
                .unwrap_or_else(|| panic!("{name}/{title}: no gridPos"));
            let x = g.get("x").and_then(Value::as_u64).unwrap_or(99);
            let w = g.get("w").and_then(Value::as_u64).unwrap_or(99);
            assert!(x + w <= 24, "{name}/{title}: gridPos beyond 24 columns");
            let targets = p
                .get("targets")
                .and_then(Value::as_array)
                .unwrap_or_else(|| panic!("{name}/{title}: no targets"));
            assert!(!targets.is_empty(), "{name}/{title}: no targets");
            for t in targets {
                assert_eq!(t.get("datasource"), Some(&ds_ref), "{name}/{title}");
                let expr = t.get("expr").and_then(Value::as_str).unwrap_or("");
                assert!(!expr.trim().is_empty(), "{name}/{title}: empty expr");
            }
        }
        for q in dashboards::queries(&path) {
            assert!(
                !q.expr.contains('$') && !q.expr.contains("[["),
                "{name}/{}: undefined variable left in {:?} (defined: {defined:?})",
                q.panel,
                q.expr
            );
        }
    }
}

#[test]
fn pipeline_dashboard_covers_the_loss_accounting() {
    let path = uctel_tests::workspace_root().join("dashboards/uctel-pipeline-health.json");
    let all: String = dashboards::queries(&path)
        .iter()
        .map(|q| q.raw.clone())
        .collect::<Vec<_>>()
        .join("\n");
    for metric in [
        "uctel_collector_frames_received_total",
        "uctel_collector_loss_ratio",
        "uctel_collector_frames_lost_total",
        "uctel_collector_records_lost_total",
        "uctel_collector_frames_dropped_total",
        "uctel_collector_ring_slots_in_use",
        "uctel_collector_qp_errors_total",
        "uctel_collector_agents_connected",
        "uctel_collector_stream_resets_total",
        "uctel_agent_frames_dropped_total",
    ] {
        assert!(all.contains(metric), "no panel queries {metric}");
    }
}

#[test]
fn host_dashboard_uses_node_exporter_names() {
    let path = uctel_tests::workspace_root().join("dashboards/uctel-host-overview.json");
    let all: String = dashboards::queries(&path)
        .iter()
        .map(|q| q.raw.clone())
        .collect::<Vec<_>>()
        .join("\n");
    for metric in [
        "node_cpu_seconds_total",
        "node_memory_MemAvailable_bytes",
        "node_load1",
        "node_network_receive_bytes_total",
        "node_disk_read_bytes_total",
        "node_filesystem_avail_bytes",
    ] {
        assert!(all.contains(metric), "no panel queries {metric}");
    }
    for q in dashboards::queries(&path) {
        assert!(
            q.raw.contains("agent=~\"$agent\""),
            "{}: not filtered by $agent: {}",
            q.panel,
            q.raw
        );
    }
}

/// The example scrape configuration for a collector pool (file_sd and DNS SD) is one
/// Prometheus accepts, and its file_sd targets file parses.
#[test]
fn the_pool_scrape_config_passes_promtool_check_config() {
    let dir = uctel_tests::workspace_root().join("config/prometheus");
    let out = std::process::Command::new(uctel_testkit::promtool::binary())
        .current_dir(&dir)
        .args(["check", "config", "prometheus-pool.yml"])
        .output()
        .unwrap_or_else(|e| panic!("promtool: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
    let sd: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("uctel-collectors.json"))
            .unwrap_or_else(|e| panic!("uctel-collectors.json: {e}")),
    )
    .unwrap_or_else(|e| panic!("uctel-collectors.json: {e}"));
    assert!(
        sd[0]["targets"].as_array().is_some_and(|t| t.len() == 3),
        "{sd}"
    );
}
