//! The agent's node_exporter-style host collectors `filefd`, `uname`, `entropy`, `vmstat`,
//! `sockstat`, `netstat`, `pressure`, `os`, `conntrack`, `softnet`, `schedstat`, `arp`, `netclass`,
//! `thermal_zone`, `edac`, `nvme`, `mdadm`, `bonding`, `time`, `timex`, `udp_queues` and
//! `selinux` against the real
//! node_exporter (Debian's `prometheus-node-exporter` 1.5), one node_exporter per collector
//! (`--collector.disable-defaults --collector.X`): for each collector, the series identities
//! (name and labels but `agent` and `instance`) of its metric families at the collector must
//! equal node_exporter's, and so must each family's help text, its type (except that the
//! protocol's untyped samples are exposed as gauges) and the values that do not move on a live
//! host (`node_uname_info`, `node_os_*`, limits, `node_scrape_collector_success`). Values
//! that move (counters, current gauges) are compared by identity only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use uctel_tests::daemon::Daemon;
use uctel_tests::exposition::{scrape, Scrape};
use uctel_tests::node_exporter::{self, same, series};
use uctel_tests::pipeline::Pipeline;

/// Each collector and the prefixes of its metric family names.
const COLLECTORS: [(&str, &[&str]); 22] = [
    ("filefd", &["node_filefd_"]),
    ("uname", &["node_uname_"]),
    ("entropy", &["node_entropy_"]),
    ("vmstat", &["node_vmstat_"]),
    ("sockstat", &["node_sockstat_"]),
    ("netstat", &["node_netstat_"]),
    ("pressure", &["node_pressure_"]),
    ("os", &["node_os_"]),
    ("conntrack", &["node_nf_conntrack_"]),
    ("softnet", &["node_softnet_"]),
    ("schedstat", &["node_schedstat_"]),
    ("arp", &["node_arp_"]),
    ("netclass", &["node_network_"]),
    (
        "thermal_zone",
        &["node_thermal_zone_", "node_cooling_device_"],
    ),
    ("edac", &["node_edac_"]),
    ("nvme", &["node_nvme_"]),
    ("mdadm", &["node_md_"]),
    ("bonding", &["node_bonding_"]),
    ("time", &["node_time_"]),
    ("timex", &["node_timex_"]),
    ("udp_queues", &["node_udp_"]),
    ("selinux", &["node_selinux_"]),
];

/// Whether the series or family `key` is one of `collector`'s, by `prefixes`. The agent also
/// runs `netdev`, whose `node_network_{receive,transmit}_*_total` are not `netclass`'s.
fn owned(collector: &str, prefixes: &[&str], key: &str) -> bool {
    let name = key.split('{').next().unwrap_or_default();
    let netdev = (name.starts_with("node_network_receive_")
        || name.starts_with("node_network_transmit_"))
        && name.ends_with("_total");
    prefixes.iter().any(|p| name.starts_with(p)) && !(collector == "netclass" && netdev)
}

/// Series whose value does not move on a live host.
fn fixed(key: &str) -> bool {
    let name = key.split('{').next().unwrap_or_default();
    name.ends_with("_info")
        || name == "node_os_version"
        || name == "node_filefd_maximum"
        || name == "node_entropy_pool_size_bits"
        || name == "node_nf_conntrack_entries_limit"
        || name == "node_network_up"
        || name == "node_network_mtu_bytes"
        || name == "node_network_flags"
        || name == "node_network_iface_id"
        || name == "node_network_protocol_type"
        || name == "node_network_speed_bytes"
        || name == "node_scrape_collector_success"
        || name == "node_time_zone_offset_seconds"
        || name == "node_timex_tick_seconds"
        || name == "node_timex_loop_time_constant"
        || name == "node_timex_tai_offset_seconds"
        || name == "node_selinux_enabled"
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

fn start_node_exporter(p: &Pipeline, collector: &str) -> (SocketAddr, Daemon) {
    node_exporter::start(
        p.path(),
        &format!("node-exporter-{collector}"),
        &[
            "--collector.disable-defaults".to_owned(),
            format!("--collector.{collector}"),
        ],
    )
}

#[test]
fn the_host_collectors_serve_what_node_exporter_serves() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let exporters: Vec<(&str, &[&str], SocketAddr, Daemon)> = COLLECTORS
        .iter()
        .map(|(c, prefix)| {
            let (addr, d) = start_node_exporter(&p, c);
            (*c, *prefix, addr, d)
        })
        .collect();
    p.add_agent("host-agent", 0.0, 1.0);
    let mine = |smp: &uctel_testkit::Sample| smp.label("agent") == Some("host-agent");
    uctel_tests::wait_for(
        "the new collectors' series at the collector",
        Duration::from_secs(40),
        Duration::from_millis(500),
        || {
            let c = p.scrape()?;
            let at = series(&c, &["agent", "instance"], mine);
            let missing: Vec<&str> = COLLECTORS
                .iter()
                .filter(|(c, _)| {
                    !at.contains_key(&format!("node_scrape_collector_success{{collector={c:?}}}"))
                })
                .map(|(c, _)| *c)
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("no success series yet for {missing:?}"))
            }
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));

    // Two direct scrapes around one of the collector, more than two agent intervals apart: a
    // value the same in both is the value the collector must hold.
    let direct = |addr: SocketAddr| scrape(addr).unwrap_or_else(|e| panic!("{e}"));
    let before: Vec<Scrape> = exporters.iter().map(|e| direct(e.2)).collect();
    std::thread::sleep(Duration::from_millis(2500));
    let collector = p.scrape().unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(2500));
    let after: Vec<Scrape> = exporters.iter().map(|e| direct(e.2)).collect();

    let at_collector = series(&collector, &["agent", "instance"], mine);
    let collector_families = families(&collector.text);
    let mut diff = Vec::new();
    for (i, (name, prefixes, _, _)) in exporters.iter().enumerate() {
        let success = format!("node_scrape_collector_success{{collector={name:?}}}");
        let belongs = |k: &str| owned(name, prefixes, k) || k == success;
        let ne_before: BTreeMap<String, f64> = series(&before[i], &[], |_| true)
            .into_iter()
            .filter(|(k, _)| belongs(k))
            .collect();
        let ne_after = series(&after[i], &[], |_| true);
        let ours: BTreeMap<&String, &f64> =
            at_collector.iter().filter(|(k, _)| belongs(k)).collect();
        let ne_keys: BTreeSet<&String> = ne_before.keys().collect();
        let our_keys: BTreeSet<&String> = ours.keys().copied().collect();
        let mut compared = 0;
        for k in ne_keys.difference(&our_keys) {
            diff.push(format!("{name}: missing at the collector: {k}"));
        }
        for k in our_keys.difference(&ne_keys) {
            diff.push(format!("{name}: only at the collector: {k}"));
        }
        for (k, v) in &ne_before {
            let (Some(c), true) = (ours.get(k), fixed(k)) else {
                continue;
            };
            compared += 1;
            let later = ne_after.get(k).copied().unwrap_or(f64::NAN);
            if !same(**c, *v) || !same(*v, later) {
                diff.push(format!(
                    "{name}: {k}: node_exporter {v} then {later}, collector {c}"
                ));
            }
        }
        let ne_families = families(&before[i].text);
        let mine = ne_families.iter().filter(|(f, _)| owned(name, prefixes, f));
        for (family, (help, ty)) in mine {
            match collector_families.get(family) {
                None => diff.push(format!("{name}: no family {family} at the collector")),
                Some((our_help, our_ty)) => {
                    if our_help != help {
                        diff.push(format!("{name}: {family} help {our_help:?}, want {help:?}"));
                    }
                    // The protocol's untyped samples are exposed as gauges.
                    let want = if ty == "untyped" {
                        "gauge"
                    } else {
                        ty.as_str()
                    };
                    if our_ty != want {
                        diff.push(format!("{name}: {family} type {our_ty}, want {want}"));
                    }
                }
            }
        }
        println!(
            "{name}: node_exporter {} series, collector {}, {compared} fixed values compared, success {}",
            ne_keys.len(),
            our_keys.len(),
            ne_before.get(&success).copied().unwrap_or(f64::NAN)
        );
    }
    assert!(
        diff.is_empty(),
        "{} differences:\n{}",
        diff.len(),
        diff.join("\n")
    );
    p.agents[0].daemon.stop(Duration::from_secs(20));
    drop(exporters);
}
