//! Structural checks of the Grafana dashboards in `dashboards/` (no server needed): they
//! import as the README says (schemaVersion, a `datasource` variable of type `datasource`
//! used by every panel and target, the `agent` variable from
//! `label_values(uctel_collector_frames_received_total, agent)`, on the host dashboard
//! `label_values(node_load1, agent)` so that it works on remote-written data alone, on the
//! fabric dashboard `label_values(node_infiniband_info, agent)`, on the job dashboard
//! `label_values(uctel_job_info, agent)`, on the pod dashboard
//! `label_values(uctel_pod_device_info, agent)`), every panel has queries,
//! ids and grid positions are sane, and every variable a query uses is defined. The fabric
//! dashboard's series names are the ones the agent makes: `hw_counters` files of the mlx5
//! driver (the ConnectX fixture's), port counters of [`PORT_COUNTERS`], ethtool names derived
//! by [`series_identity`] from mlx5's `ethtool -S` names.
//! The queries themselves are evaluated against a real Prometheus in `e2e.rs`.

use std::collections::HashSet;

use serde_json::Value;
use uctel_agent::sources::node::ethtool::series_identity;
use uctel_agent::sources::rdma::PORT_COUNTERS;
use uctel_tests::dashboards;

#[test]
fn there_are_the_five_dashboards() {
    let names: Vec<String> = dashboards::files()
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(
        names,
        vec![
            "uctel-fabric.json",
            "uctel-host-overview.json",
            "uctel-jobs.json",
            "uctel-pipeline-health.json",
            "uctel-pods.json"
        ]
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
        // remote-write alone); the fabric dashboard those with an RDMA device; the job
        // dashboard those running a Slurm job.
        let want = if name.ends_with("uctel-host-overview.json") {
            "label_values(node_load1, agent)"
        } else if name.ends_with("uctel-fabric.json") {
            "label_values(node_infiniband_info, agent)"
        } else if name.ends_with("uctel-jobs.json") {
            "label_values(uctel_job_info, agent)"
        } else if name.ends_with("uctel-pods.json") {
            "label_values(uctel_pod_device_info, agent)"
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
            // `$1` in a `label_replace` replacement is the regex's group, not a variable
            // (Grafana leaves `$<name>` alone when no variable has that name, and no variable
            // name is a number).
            let left = q
                .expr
                .match_indices('$')
                .any(|(i, _)| !q.expr[i + 1..].starts_with(|c: char| c.is_ascii_digit()));
            assert!(
                !left && !q.expr.contains("[["),
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
        "uctel_collector_agent_up",
        "uctel_collector_stream_resets_total",
        "uctel_collector_agent_frames_dropped_total",
        "uctel_collector_agent_records_dropped_total",
        "uctel_collector_agent_frames_sent_total",
    ] {
        assert!(all.contains(metric), "no panel queries {metric}");
    }
    // The agents' drop and send counters as the collector exports them from heartbeats, not
    // the copy shipped in the agents' metrics frames (the frames a no_credit drop discards:
    // that copy freezes while the agent drops).
    for stale in [
        "uctel_agent_frames_dropped_total",
        "uctel_agent_records_dropped_total",
        "uctel_agent_frames_sent_total",
    ] {
        assert!(
            !all.contains(stale),
            "a panel queries {stale}, the copy that travels in the frames being dropped"
        );
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

fn all_queries(file: &str) -> Vec<dashboards::PanelQuery> {
    dashboards::queries(&uctel_tests::workspace_root().join("dashboards").join(file))
}

/// Every metric name a query selects: identifiers followed by `{` or `[`, and the names a
/// `__name__=~"..."` matcher spells out (regex alternatives are not expanded).
fn selected_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
            {
                i += 1;
            }
            let quoted = start > 0 && bytes[start - 1] == b'"';
            if !quoted && i < bytes.len() && bytes[i] == b'{' {
                out.push(expr[start..i].to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn selected_names_finds_the_selectors() {
    assert_eq!(
        selected_names(
            "sum by (agent) (rate(node_a_total{x=\"y\"}[1m])) and on (agent) node_b{agent=~\".+\"}"
        ),
        vec!["node_a_total", "node_b"]
    );
}

/// The fabric dashboard queries each counter the fabric panels are about, filters every
/// query by `$agent` (and every `node_*` selector by `$instance`), and uses only names the
/// agent exports: `node_infiniband_<file>` for a file of the ConnectX fixture's `hw_counters/`
/// (mlx5 names, kernel `drivers/infiniband/hw/mlx5/counters.c`) or a [`PORT_COUNTERS`] name,
/// and `node_ethtool_*` names that [`series_identity`] makes from mlx5's `ethtool -S` names
/// (kernel `drivers/net/ethernet/mellanox/mlx5/core/en_stats.c`).
#[test]
fn fabric_dashboard_uses_the_agents_names() {
    let queries = all_queries("uctel-fabric.json");
    let all: String = queries
        .iter()
        .map(|q| q.raw.clone())
        .collect::<Vec<_>>()
        .join("\n");
    for metric in [
        "node_infiniband_np_ecn_marked_roce_packets",
        "node_infiniband_np_cnp_sent",
        "node_infiniband_rp_cnp_handled",
        "node_infiniband_out_of_buffer",
        "node_infiniband_out_of_sequence",
        "node_infiniband_packet_seq_err",
        "node_infiniband_local_ack_timeout_err",
        "node_infiniband_roce_adp_retrans",
        "node_ethtool_received_pause_ctrl_phy",
        "node_ethtool_transmitted_pause_ctrl_phy",
        "node_ethtool_(received|transmitted)_prio[0-7]_pause",
        "_per_second",
        "uctel_collector_frames_lost_total",
        "uctel_collector_records_lost_total",
        "uctel_agent_rdma_port_state_changes_total",
        "uctel_agent_rdma_gid_changes_total",
        "uctel_agent_rdma_async_events_total",
    ] {
        assert!(all.contains(metric), "no panel queries {metric}");
    }
    for (raw, want) in [
        ("rx_pause_ctrl_phy", "node_ethtool_received_pause_ctrl_phy"),
        (
            "tx_pause_ctrl_phy",
            "node_ethtool_transmitted_pause_ctrl_phy",
        ),
        ("rx_prio3_pause", "node_ethtool_received_prio3_pause"),
        ("tx_prio3_pause", "node_ethtool_transmitted_prio3_pause"),
    ] {
        assert_eq!(series_identity(raw).0, want, "{raw}");
    }

    let fixture = uctel_tests::workspace_root()
        .join("agent/tests/data/connectx-6-dx/sys/class/infiniband/mlx5_0/ports/1/hw_counters");
    let hw: HashSet<String> = std::fs::read_dir(&fixture)
        .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()))
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(hw.contains("out_of_buffer"), "{hw:?}");
    let port: HashSet<&str> = PORT_COUNTERS.iter().map(|c| c.1).collect();
    let gauges = [
        "info",
        "state_id",
        "physical_state_id",
        "rate_bytes_per_second",
    ];
    let ethtool = ["received_pause_ctrl_phy", "transmitted_pause_ctrl_phy"];
    let mut checked = 0;
    for q in &queries {
        assert!(
            q.raw.contains("agent=~\"$agent\""),
            "{}: not filtered by $agent: {}",
            q.panel,
            q.raw
        );
        for name in selected_names(&q.raw) {
            if let Some(file) = name.strip_prefix("node_infiniband_") {
                assert!(
                    hw.contains(file) || port.contains(file) || gauges.contains(&file),
                    "{}: {name} is no series the agent makes from the mlx5 tree",
                    q.panel
                );
                checked += 1;
            } else if let Some(stat) = name.strip_prefix("node_ethtool_") {
                assert!(ethtool.contains(&stat), "{}: {name}", q.panel);
                checked += 1;
            } else {
                assert!(
                    name.starts_with("uctel_"),
                    "{}: unexpected selector {name}",
                    q.panel
                );
            }
        }
        for sel in q.raw.split("node_").skip(1) {
            let body = sel.split('}').next().unwrap_or("");
            if body.contains("agent=~") {
                assert!(
                    body.contains("instance=~\"$instance\""),
                    "{}: node_{body} not filtered by $instance",
                    q.panel
                );
            }
        }
    }
    assert!(checked >= 15, "only {checked} node_* selectors checked");
}

/// The job dashboard: every panel is per job (`job_id` kept by its outer aggregation, or the
/// jobs table), every query filtered by `$agent` and reading only `uctel_job_info` and
/// the series the agents and collectors make (the fabric dashboard's rule: `node_infiniband_`
/// names from the mlx5 fixture's `hw_counters/` or their fast-counter `_per_second`, mlx5
/// ethtool names). The host's series are joined to the jobs through `uctel_job_info` on
/// `(agent, instance)`, the labels the collector gives every agent series; the collectors'
/// own loss counters, whose `instance` is the collector's, on `agent` alone.
#[test]
fn job_dashboard_joins_host_series_through_job_info() {
    let queries = all_queries("uctel-jobs.json");
    let all: String = queries
        .iter()
        .map(|q| q.raw.clone())
        .collect::<Vec<_>>()
        .join("\n");
    for metric in [
        "uctel_job_info",
        "uctel_job_cpu_seconds_total",
        "uctel_job_memory_bytes",
        "node_infiniband_np_ecn_marked_roce_packets",
        "node_infiniband_np_cnp_sent",
        "node_infiniband_rp_cnp_handled",
        "node_infiniband_out_of_buffer",
        "node_infiniband_out_of_buffer_per_second",
        "node_infiniband_out_of_sequence",
        "node_ethtool_received_pause_ctrl_phy",
        "node_ethtool_transmitted_pause_ctrl_phy",
        "node_ethtool_received_prio[0-7]_pause",
        "node_ethtool_transmitted_prio[0-7]_pause",
        "uctel_collector_frames_lost_total",
        "uctel_collector_records_lost_total",
    ] {
        assert!(all.contains(metric), "no panel queries {metric}");
    }
    let fixture = uctel_tests::workspace_root()
        .join("agent/tests/data/connectx-6-dx/sys/class/infiniband/mlx5_0/ports/1/hw_counters");
    let hw: HashSet<String> = std::fs::read_dir(&fixture)
        .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()))
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let ethtool = ["received_pause_ctrl_phy", "transmitted_pause_ctrl_phy"];
    let mut joined = 0;
    for q in &queries {
        assert!(
            q.raw.contains("agent=~\"$agent\""),
            "{}: not filtered by $agent: {}",
            q.panel,
            q.raw
        );
        assert!(
            q.raw.contains("uctel_job_info{"),
            "{}: not joined to the jobs: {}",
            q.panel,
            q.raw
        );
        assert!(
            q.raw.starts_with("sum by (job_id, user)")
                || q.raw.starts_with("-sum by (job_id, user)")
                || q.raw.starts_with("max by (job_id,"),
            "{}: not per job: {}",
            q.panel,
            q.raw
        );
        let host = q.raw.contains("node_");
        let collector = q.raw.contains("uctel_collector_");
        if host {
            assert!(
                q.raw.contains(
                    "* on (agent, instance) group_right group by (agent, instance, job_id, user) (uctel_job_info{"
                ),
                "{}: host series not joined on (agent, instance): {}",
                q.panel,
                q.raw
            );
            joined += 1;
        }
        if collector {
            assert!(
                q.raw.contains(
                    "* on (agent) group_right group by (agent, job_id, user) (uctel_job_info{"
                ),
                "{}: collector series not joined on agent: {}",
                q.panel,
                q.raw
            );
            joined += 1;
        }
        for name in selected_names(&q.raw) {
            if let Some(file) = name.strip_prefix("node_infiniband_") {
                let file = file.strip_suffix("_per_second").unwrap_or(file);
                assert!(hw.contains(file), "{}: {name}", q.panel);
            } else if let Some(stat) = name.strip_prefix("node_ethtool_") {
                assert!(ethtool.contains(&stat), "{}: {name}", q.panel);
            } else {
                assert!(name.starts_with("uctel_"), "{}: {name}", q.panel);
            }
        }
    }
    assert!(joined >= 12, "only {joined} joined queries");
}

/// The pod dashboard: every panel is per pod (`namespace`, `pod` kept by its outer
/// aggregation, or the devices table), every query filtered by `$agent` and joined through
/// `uctel_pod_device_info`: device counters on `(agent, instance, device)` (the device the
/// kubelet allocated), host-wide pause frames on `(agent, instance)`, the collectors' loss
/// counters on `agent`. Names follow the job dashboard's rule.
#[test]
fn pod_dashboard_joins_series_through_pod_device_info() {
    let queries = all_queries("uctel-pods.json");
    let all: String = queries
        .iter()
        .map(|q| q.raw.clone())
        .collect::<Vec<_>>()
        .join("\n");
    for metric in [
        "uctel_pod_device_info",
        "node_infiniband_np_ecn_marked_roce_packets",
        "node_infiniband_np_cnp_sent",
        "node_infiniband_out_of_buffer",
        "node_infiniband_out_of_buffer_per_second",
        "node_infiniband_out_of_sequence",
        "node_ethtool_received_pause_ctrl_phy",
        "uctel_collector_frames_lost_total",
    ] {
        assert!(all.contains(metric), "no panel queries {metric}");
    }
    let info = "(uctel_pod_device_info{";
    let mut by_device = 0;
    for q in &queries {
        assert!(
            q.raw.contains("agent=~\"$agent\""),
            "{}: {}",
            q.panel,
            q.raw
        );
        assert!(
            q.raw.contains(info),
            "{}: not joined to the pods: {}",
            q.panel,
            q.raw
        );
        assert!(
            q.raw.starts_with("sum by (namespace, pod)")
                || q.raw.starts_with("-sum by (namespace, pod)")
                || q.raw.starts_with("max by (namespace, pod,"),
            "{}: not per pod: {}",
            q.panel,
            q.raw
        );
        if q.raw.contains("node_infiniband_") {
            assert!(
                q.raw.contains("* on (agent, instance, device) group_right group by (agent, instance, device, namespace, pod) (uctel_pod_device_info{"),
                "{}: device series not joined on the device: {}",
                q.panel,
                q.raw
            );
            by_device += 1;
        }
        for name in selected_names(&q.raw) {
            assert!(
                name.starts_with("node_infiniband_")
                    || name.starts_with("node_ethtool_")
                    || name.starts_with("uctel_"),
                "{}: {name}",
                q.panel
            );
        }
    }
    assert!(by_device >= 5, "only {by_device} device queries");
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
