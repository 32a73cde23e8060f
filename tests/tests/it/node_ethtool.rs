//! The agent's `ethtool` host collector (`sources.host_metrics.ethtool`) against the real
//! node_exporter (Debian's `prometheus-node-exporter` 1.5.0, `--collector.disable-defaults
//! --collector.ethtool`) on real interfaces: a veth pair made for the test (driver `veth`,
//! per-queue XDP counters, `peer_ifindex`) plus the machine's own (`eth0` on a virtio VM:
//! `virtio_net` per-queue counters and link settings; `ifb*`; `lo`, which refuses every
//! ethtool request). Both read the same interfaces through the same device regex; for each
//! case the series identities (name and labels but `agent` and `instance`) at the collector
//! must equal node_exporter's, and so must each family's help text and type (the protocol's
//! untyped samples are exposed as gauges). Values are compared where they do not move: in two
//! node_exporter scrapes around the collector's, and always for `node_ethtool_info`, the link
//! series and `peer_ifindex` (the other end's ifindex from sysfs).
//!
//! The second case filters with `metrics_include` (node_exporter's
//! `--collector.ethtool.metrics-include`): its statistic series must be a non-empty strict
//! subset of the first case's, and every one's raw name (in its help) must match.
//!
//! Two more agents: one without the section serves no ethtool series at all; one whose sysfs
//! lists an interface that does not exist gets ENODEV for every request, serves only
//! `node_scrape_collector_success{collector="ethtool"} 1` (as node_exporter, which only logs
//! such errors) and counts each failed request in
//! `uctel_agent_source_errors_total{source="ethtool",reason}`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use uctel_tests::daemon::Daemon;
use uctel_tests::exposition::{scrape, Scrape};
use uctel_tests::net::Veth;
use uctel_tests::node_exporter::{self, same, series};
use uctel_tests::pipeline::Pipeline;

fn ifindex(dev: &str) -> f64 {
    let path = format!("/sys/class/net/{dev}/ifindex");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {text:?}: {e}"))
}

/// The link-settings families of node_exporter 1.5.0's ethtool collector.
const LINK_FAMILIES: [&str; 10] = [
    "node_network_supported_speed_bytes",
    "node_network_advertised_speed_bytes",
    "node_network_supported_port_info",
    "node_network_autonegotiate_supported",
    "node_network_pause_supported",
    "node_network_asymmetricpause_supported",
    "node_network_autonegotiate_advertised",
    "node_network_pause_advertised",
    "node_network_asymmetricpause_advertised",
    "node_network_autonegotiate",
];

const SUCCESS: &str = "node_scrape_collector_success{collector=\"ethtool\"}";

fn family(key: &str) -> &str {
    key.split('{').next().unwrap_or_default()
}

/// Whether the series or family `key` is the ethtool collector's.
fn owned(key: &str) -> bool {
    let name = family(key);
    name.starts_with("node_ethtool_") || LINK_FAMILIES.contains(&name) || key == SUCCESS
}

/// Series whose value does not move.
fn fixed(key: &str) -> bool {
    let name = family(key);
    name == "node_ethtool_info"
        || name == "node_ethtool_peer_ifindex"
        || LINK_FAMILIES.contains(&name)
        || key == SUCCESS
}

/// Family name → (`# HELP` text, `# TYPE`) of an exposition.
fn families(text: &str) -> BTreeMap<String, (String, String)> {
    let mut out: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_owned()).or_default().0 = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_owned()).or_default().1 = ty.to_owned();
        }
    }
    out
}

/// The second case's `metrics_include`: raw names starting with one of [`FILTER_PREFIXES`].
const FILTER: &str = "^(rx_queue_0_|tx_queue_0_|rx0_|peer)";
const FILTER_PREFIXES: [&str; 4] = ["rx_queue_0_", "tx_queue_0_", "rx0_", "peer"];

struct Case {
    agent: &'static str,
    metrics_include: Option<&'static str>,
    addr: SocketAddr,
    _exporter: Daemon,
}

#[test]
fn the_ethtool_collector_serves_what_node_exporter_serves() {
    let _guard = uctel_tests::exclusive();
    let veth = Veth::new();
    let devices = format!("^({}|{}|eth0|ifb0|lo)$", veth.a, veth.b);
    let mut p = Pipeline::start();
    let cases: Vec<Case> = [("ethtool-all", None), ("ethtool-queue0", Some(FILTER))]
        .into_iter()
        .map(|(agent, metrics_include)| {
            let mut args = vec![
                "--collector.disable-defaults".to_owned(),
                "--collector.ethtool".to_owned(),
                format!("--collector.ethtool.device-include={devices}"),
            ];
            if let Some(m) = metrics_include {
                args.push(format!("--collector.ethtool.metrics-include={m}"));
            }
            let (addr, exporter) =
                node_exporter::start(p.path(), &format!("node-exporter-{agent}"), &args);
            Case {
                agent,
                metrics_include,
                addr,
                _exporter: exporter,
            }
        })
        .collect();
    for case in &cases {
        let (devices, metrics) = (devices.clone(), case.metrics_include);
        p.add_agent_with(case.agent, 0.0, 1.0, |y| {
            y.set("sources.host_metrics.ethtool.device_include", devices);
            if let Some(m) = metrics {
                y.set("sources.host_metrics.ethtool.metrics_include", m);
            }
        });
    }
    // An agent without the section: no ethtool series at all.
    p.add_agent("ethtool-off", 0.0, 1.0);
    // An agent whose sysfs lists an interface that does not exist: every request fails with
    // ENODEV, which is skipped and counted.
    let ghost_sys = p.path().join("ghost-sys");
    std::fs::create_dir_all(ghost_sys.join("class/net/uctghost0"))
        .unwrap_or_else(|e| panic!("{e}"));
    let ghost = p.add_agent_with("ethtool-ghost", 0.0, 1.0, |y| {
        y.set(
            "sources.host_metrics.sysfs_path",
            ghost_sys.display().to_string(),
        )
        .set("sources.host_metrics.ethtool.device_include", "^uctghost0$");
    });
    let peer = format!("node_ethtool_peer_ifindex{{device={:?}}}", veth.a);
    uctel_tests::wait_for(
        "the ethtool agents' series at the collector",
        Duration::from_secs(40),
        Duration::from_millis(500),
        || {
            let c = p.scrape()?;
            for agent in ["ethtool-all", "ethtool-queue0"] {
                let at = series(&c, &["agent", "instance"], |s| {
                    s.label("agent") == Some(agent)
                });
                if !at.contains_key(SUCCESS) || !at.contains_key(&peer) {
                    return Err(format!("no ethtool series yet for {agent}"));
                }
            }
            let off = series(&c, &["agent", "instance"], |s| {
                s.label("agent") == Some("ethtool-off")
            });
            if !off.contains_key("node_scrape_collector_success{collector=\"cpu\"}") {
                return Err("no series yet for ethtool-off".to_owned());
            }
            Ok(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));

    // Two direct scrapes around one of the collector, more than two agent intervals apart: a
    // value the same in both is the value the collector must hold.
    let direct = |addr: SocketAddr| scrape(addr).unwrap_or_else(|e| panic!("{e}"));
    let before: Vec<Scrape> = cases.iter().map(|c| direct(c.addr)).collect();
    std::thread::sleep(Duration::from_millis(2500));
    let collector = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(2500));
    let after: Vec<Scrape> = cases.iter().map(|c| direct(c.addr)).collect();

    let collector_families = families(&collector.text);
    let mut diff = Vec::new();
    let mut stat_keys: Vec<BTreeSet<String>> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = case.agent;
        let ne_before: BTreeMap<String, f64> = series(&before[i], &[], |_| true)
            .into_iter()
            .filter(|(k, _)| owned(k))
            .collect();
        let ne_after = series(&after[i], &[], |_| true);
        let ours: BTreeMap<String, f64> = series(&collector, &["agent", "instance"], |s| {
            s.label("agent") == Some(name)
        })
        .into_iter()
        .filter(|(k, _)| owned(k))
        .collect();
        let ne_keys: BTreeSet<&String> = ne_before.keys().collect();
        let our_keys: BTreeSet<&String> = ours.keys().collect();
        for k in ne_keys.difference(&our_keys) {
            diff.push(format!("{name}: missing at the collector: {k}"));
        }
        for k in our_keys.difference(&ne_keys) {
            diff.push(format!("{name}: only at the collector: {k}"));
        }
        let (mut compared, mut still) = (0, 0);
        for (k, v) in &ne_before {
            let Some(c) = ours.get(k) else { continue };
            let later = ne_after.get(k).copied().unwrap_or(f64::NAN);
            if fixed(k) {
                compared += 1;
                if !same(*c, *v) || !same(*v, later) {
                    diff.push(format!(
                        "{name}: {k}: node_exporter {v} then {later}, collector {c}"
                    ));
                }
            } else if same(*v, later) {
                // Did not move across the collector's scrape: the collector must hold it.
                still += 1;
                if !same(*c, *v) {
                    diff.push(format!(
                        "{name}: {k}: node_exporter {v} (still), collector {c}"
                    ));
                }
            }
        }
        // `peer_ifindex` is the other end's ifindex.
        for (dev, other) in [(&veth.a, &veth.b), (&veth.b, &veth.a)] {
            let k = format!("node_ethtool_peer_ifindex{{device={dev:?}}}");
            let want = ifindex(other);
            if ours.get(&k).is_none_or(|v| !same(*v, want)) {
                diff.push(format!("{name}: {k} {:?}, want {want}", ours.get(&k)));
            }
        }
        if ours.keys().any(|k| k.contains("device=\"lo\"")) {
            diff.push(format!("{name}: series for lo, which refuses ethtool"));
        }
        let ne_families = families(&before[i].text);
        for (fam, (help, ty)) in ne_families.iter().filter(|(f, _)| owned(f)) {
            match collector_families.get(fam) {
                None => diff.push(format!("{name}: no family {fam} at the collector")),
                Some((our_help, our_ty)) => {
                    if our_help != help {
                        diff.push(format!("{name}: {fam} help {our_help:?}, want {help:?}"));
                    }
                    let want = if ty == "untyped" {
                        "gauge"
                    } else {
                        ty.as_str()
                    };
                    if our_ty != want {
                        diff.push(format!("{name}: {fam} type {our_ty}, want {want}"));
                    }
                }
            }
        }
        let devices: BTreeSet<&str> = ne_before
            .keys()
            .filter_map(|k| k.split("device=\"").nth(1)?.split('"').next())
            .collect();
        println!(
            "{name}: node_exporter {} series, collector {}, devices {devices:?}, {compared} fixed \
             and {still} still values compared, success {}",
            ne_keys.len(),
            our_keys.len(),
            ne_before.get(SUCCESS).copied().unwrap_or(f64::NAN)
        );
        stat_keys.push(
            ours.keys()
                .filter(|k| {
                    family(k).starts_with("node_ethtool_") && family(k) != "node_ethtool_info"
                })
                .cloned()
                .collect(),
        );
    }

    // metrics_include: a non-empty strict subset, each raw name (the help's tail) matching.
    let (all, some) = (&stat_keys[0], &stat_keys[1]);
    assert!(
        !some.is_empty() && some.is_subset(all) && some.len() < all.len(),
        "filtered {} of {} statistic series",
        some.len(),
        all.len()
    );
    for k in some {
        let help = collector_families
            .get(family(k))
            .map(|(h, _)| h.as_str())
            .unwrap_or_default();
        let raw = help.strip_prefix("Network interface ").unwrap_or(help);
        if !FILTER_PREFIXES.iter().any(|p| raw.starts_with(p)) {
            diff.push(format!(
                "ethtool-queue0: {k} (raw {raw:?}) does not match the filter"
            ));
        }
    }
    println!(
        "metrics_include: {} of {} statistic series",
        some.len(),
        all.len()
    );

    let off: Vec<String> = series(&collector, &["agent", "instance"], |s| {
        s.label("agent") == Some("ethtool-off")
    })
    .into_keys()
    .filter(|k| owned(k) || k.contains("collector=\"ethtool\""))
    .collect();
    // The ghost interface's failures, counted by the agent at every collection.
    let ghost_metrics = scrape(p.agents[ghost].options.metrics).unwrap_or_else(|e| panic!("{e}"));
    let ghost_errors: BTreeMap<String, f64> = series(&ghost_metrics, &[], |s| {
        s.name == "uctel_agent_source_errors_total" && s.label("source") == Some("ethtool")
    });
    println!("ethtool-ghost: {ghost_errors:?}");
    for reason in ["link_info_error", "driver_info_error", "stats_error"] {
        let k = format!("uctel_agent_source_errors_total{{reason={reason:?},source=\"ethtool\"}}");
        if ghost_errors.get(&k).is_none_or(|v| *v < 1.0) {
            diff.push(format!("ethtool-ghost: {k} not counted"));
        }
    }
    let ghost_at: Vec<String> = series(&collector, &["agent", "instance"], |s| {
        s.label("agent") == Some("ethtool-ghost")
    })
    .into_iter()
    .filter(|(k, _)| owned(k))
    .map(|(k, v)| format!("{k} {v}"))
    .collect();
    if ghost_at != [format!("{SUCCESS} 1")] {
        diff.push(format!(
            "ethtool-ghost serves {ghost_at:?}, want success 1 only"
        ));
    }
    println!("differences: {}", diff.len());
    for d in &diff {
        println!("  {d}");
    }
    assert!(off.is_empty(), "ethtool-off serves {off:?}");
    assert!(
        diff.is_empty(),
        "{} differences:\n{}",
        diff.len(),
        diff.join("\n")
    );
    for agent in &mut p.agents {
        agent.daemon.stop(Duration::from_secs(20));
    }
    drop(cases);
    drop(veth);
}
