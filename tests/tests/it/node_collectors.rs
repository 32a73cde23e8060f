//! The agent's node_exporter-style host collectors `filefd`, `uname`, `entropy`, `vmstat`,
//! `sockstat`, `netstat`, `pressure`, `os`, `conntrack`, `softnet`, `schedstat`, `arp`, `netclass`,
//! `thermal_zone`, `edac`, `nvme`, `mdadm`, `bonding`, `hwmon`, `time`, `timex`, `udp_queues`
//! and `selinux` against the real
//! node_exporter (Debian's `prometheus-node-exporter` 1.5), one node_exporter per collector
//! (`--collector.disable-defaults --collector.X`): for each collector, the series identities
//! (name and labels but `agent` and `instance`) of its metric families at the collector must
//! equal node_exporter's, and so must each family's help text, its type (except that the
//! protocol's untyped samples are exposed as gauges) and the values that do not move on a live
//! host (`node_uname_info`, `node_os_*`, limits, `node_scrape_collector_success`). Values
//! that move (counters, current gauges) are compared by identity only.
//!
//! `hwmon` is also compared on fixture sysfs trees ([`hwmon_fixture`]) through
//! `--path.sysfs` and the agent's `sysfs_path`, every value included, since hosts without
//! hardware monitoring chips (virtual machines) have no `/sys/class/hwmon`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use uctel_tests::daemon::Daemon;
use uctel_tests::exposition::{scrape, Scrape};
use uctel_tests::node_exporter::{self, same, series};
use uctel_tests::pipeline::Pipeline;

/// Each collector and the prefixes of its metric family names.
const COLLECTORS: [(&str, &[&str]); 23] = [
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
    ("hwmon", &["node_hwmon_"]),
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

/// Files (path relative to the root → contents) and symbolic links (path → target, as sysfs
/// has them: `class/hwmon/hwmonN` → the chip's directory under `devices/`, the chip's `device`
/// → its parent device) of a fixture sysfs tree.
#[derive(Default)]
struct SysTree {
    files: Vec<(String, String)>,
    links: Vec<(String, String)>,
}

impl SysTree {
    /// Chip `hwmon<n>` in `devices/<device>/<chip_dir>hwmon<n>` with `attrs` (a `\n` is added
    /// to each value), linked from `class/hwmon`, with the `uevent` and `power/` every chip
    /// directory has; its directory.
    fn chip(&mut self, n: u32, device: &str, chip_dir: &str, attrs: &[(&str, &str)]) -> String {
        let dir = format!("devices/{device}/{chip_dir}hwmon{n}");
        self.links
            .push((format!("class/hwmon/hwmon{n}"), format!("../../{dir}")));
        self.files.push((format!("{dir}/uevent"), String::new()));
        self.files.push((
            format!("{dir}/power/runtime_status"),
            "unsupported\n".into(),
        ));
        for (a, v) in attrs {
            self.files.push((format!("{dir}/{a}"), format!("{v}\n")));
        }
        dir
    }

    fn write(&self, root: &std::path::Path) {
        let parent = |p: &std::path::Path| {
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            }
        };
        for (rel, text) in &self.files {
            let path = root.join(rel);
            parent(&path);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        for (rel, target) in &self.links {
            let path = root.join(rel);
            parent(&path);
            std::os::unix::fs::symlink(target, &path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

/// A sysfs tree with the hardware monitoring chips of a typical server and desktop, laid out
/// as the kernel does (`/sys/class/hwmon/hwmonN` links to the chip's directory under the
/// device that registered it, whose `device` link points back at that device), with the
/// attribute names of the drivers named (Linux `drivers/hwmon/{coretemp,nct6775-core,
/// amd_energy,sht3x,ina2xx,w83627ehf,acpi_power_meter}.c`, `drivers/thermal/thermal_hwmon.c`,
/// `drivers/gpu/drm/amd/pm/amdgpu_pm.c`, `drivers/nvme/host/hwmon.c`) and values in the units
/// of `Documentation/hwmon/sysfs-interface.rst`:
///
/// - `coretemp` (platform device `coretemp.0`): package and two cores, `input`, `crit`,
///   `crit_alarm`, `max`, `label`;
/// - `acpitz` (a thermal zone's hwmon, a virtual device: no `device` link);
/// - `nct6798` (`nct6775.656`, a Super I/O chip): fans with `min`, `alarm`, `beep`, `pulses`,
///   voltages with `min`, `max`, `alarm`, `beep`, temperatures with `type`, `offset`, a sensor
///   whose read fails with `EIO` (a link to `/proc/self/mem`, whose first page reads `EIO`,
///   stands in for a driver that answers so), `pwm`, `intrusion0_alarm`, `beep_enable`,
///   `cpu0_vid`, `vrm`;
/// - `amdgpu` (PCI `0000:09:00.0` behind bridge `0000:00:03.1`): temperature, voltage with
///   label, `power1_average`, `power1_cap*`, `pwm1*`, `freq1_*` (a type node_exporter does not
///   read), and the PCI device's own files in `device/` (`power_dpm_state`, `power/`);
/// - `nvme` (`nvme0` under its PCI function): `Composite` and `Sensor 1`;
/// - `amd_energy` (`amd_energy.0`): core and socket energy counters;
/// - `sht3x` (I²C `1-0044`): temperature, humidity, `update_interval`;
/// - `ina226` (I²C `1-0040`): shunt and bus voltage, current, power;
/// - `power_meter` (ACPI `ACPI000D:00`): `power1_average`, `power1_accuracy`,
///   `power1_average_interval{,_min,_max}`, `power1_is_battery`, text attributes;
/// - `w83627ehf` in the older layout: the sensor files and `name` in `device/`;
/// - a chip with neither `name` nor `device` (labelled by its directory), a plain file and a
///   dangling link in `class/hwmon` (not chips).
fn hwmon_fixture(root: &std::path::Path) {
    let mut t = SysTree::default();
    let d = t.chip(
        0,
        "platform/coretemp.0",
        "hwmon/",
        &[
            ("name", "coretemp"),
            ("temp1_label", "Package id 0"),
            ("temp1_input", "45000"),
            ("temp1_crit", "100000"),
            ("temp1_crit_alarm", "0"),
            ("temp1_max", "80000"),
            ("temp2_label", "Core 0"),
            ("temp2_input", "43000"),
            ("temp2_crit", "100000"),
            ("temp2_crit_alarm", "0"),
            ("temp2_max", "80000"),
            ("temp3_label", "Core 1"),
            ("temp3_input", "44000"),
            ("temp3_crit", "100000"),
            ("temp3_crit_alarm", "0"),
            ("temp3_max", "80000"),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../coretemp.0".into()));
    t.links.push((
        format!("{d}/subsystem"),
        "../../../../../class/hwmon".into(),
    ));
    t.files.push((
        "devices/platform/coretemp.0/modalias".into(),
        "platform:coretemp\n".into(),
    ));
    t.chip(
        1,
        "virtual/thermal/thermal_zone0",
        "",
        &[
            ("name", "acpitz"),
            ("temp1_input", "27800"),
            ("temp1_crit", "119000"),
        ],
    );
    let d = t.chip(
        2,
        "platform/nct6775.656",
        "hwmon/",
        &[
            ("name", "nct6798"),
            ("fan1_input", "1032"),
            ("fan1_min", "0"),
            ("fan1_alarm", "0"),
            ("fan1_beep", "0"),
            ("fan1_pulses", "2"),
            ("fan2_input", "0"),
            ("fan2_min", "0"),
            ("fan2_alarm", "1"),
            ("in0_input", "1000"),
            ("in0_min", "0"),
            ("in0_max", "1744"),
            ("in0_alarm", "0"),
            ("in0_beep", "0"),
            ("in1_input", "1016"),
            ("in1_min", "0"),
            ("in1_max", "0"),
            ("in1_alarm", "1"),
            ("temp1_label", "SYSTIN"),
            ("temp1_input", "34000"),
            ("temp1_max", "80000"),
            ("temp1_max_hyst", "75000"),
            ("temp1_type", "4"),
            ("temp1_offset", "0"),
            ("temp1_alarm", "0"),
            ("temp1_beep", "0"),
            ("temp7_label", "PCH_CHIP_CPU_MAX_TEMP"),
            ("pwm1", "153"),
            ("pwm1_enable", "5"),
            ("pwm1_mode", "1"),
            ("intrusion0_alarm", "1"),
            ("intrusion0_beep", "0"),
            ("beep_enable", "0"),
            ("cpu0_vid", "1550"),
            ("vrm", "100"),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../nct6775.656".into()));
    t.links
        .push((format!("{d}/temp7_input"), "/proc/self/mem".into()));
    let gpu = "pci0000:00/0000:00:03.1/0000:09:00.0";
    let d = t.chip(
        3,
        gpu,
        "hwmon/",
        &[
            ("name", "amdgpu"),
            ("temp1_label", "edge"),
            ("temp1_input", "45000"),
            ("temp1_crit", "100000"),
            ("temp1_crit_hyst", "-273150"),
            ("in0_label", "vddgfx"),
            ("in0_input", "806"),
            ("power1_average", "32000000"),
            ("power1_cap", "150000000"),
            ("power1_cap_max", "150000000"),
            ("power1_cap_min", "0"),
            ("pwm1", "0"),
            ("pwm1_enable", "2"),
            ("pwm1_min", "0"),
            ("pwm1_max", "255"),
            ("freq1_label", "sclk"),
            ("freq1_input", "500000000"),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../0000:09:00.0".into()));
    for (a, v) in [
        ("vendor", "0x1002"),
        ("enable", "1"),
        ("current_link_width", "16"),
        ("power_dpm_state", "balanced"),
        ("power/control", "auto"),
    ] {
        t.files
            .push((format!("devices/{gpu}/{a}"), format!("{v}\n")));
    }
    let nvme = "pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0";
    let d = t.chip(
        4,
        nvme,
        "",
        &[
            ("name", "nvme"),
            ("temp1_label", "Composite"),
            ("temp1_input", "38850"),
            ("temp1_max", "84850"),
            ("temp1_min", "-273150"),
            ("temp1_crit", "84850"),
            ("temp1_alarm", "0"),
            ("temp2_label", "Sensor 1"),
            ("temp2_input", "38850"),
            ("temp2_max", "65261850"),
            ("temp2_min", "-273150"),
        ],
    );
    t.links.push((format!("{d}/device"), "../../nvme0".into()));
    t.files.push((
        format!("devices/{nvme}/model"),
        "Samsung SSD 980 1TB\n".into(),
    ));
    t.files
        .push((format!("devices/{nvme}/state"), "live\n".into()));
    let d = t.chip(
        5,
        "platform/amd_energy.0",
        "hwmon/",
        &[
            ("name", "amd_energy"),
            ("energy1_label", "Ecore000"),
            ("energy1_input", "123456789"),
            ("energy2_label", "Ecore001"),
            ("energy2_input", "987654321000"),
            ("energy17_label", "Esocket0"),
            ("energy17_input", "5555555555555"),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../amd_energy.0".into()));
    let i2c = "pci0000:00/0000:00:1f.4/i2c-1";
    let d = t.chip(
        6,
        &format!("{i2c}/1-0044"),
        "hwmon/",
        &[
            ("name", "sht3x"),
            ("temp1_input", "23450"),
            ("temp1_max", "60000"),
            ("temp1_alarm", "0"),
            ("humidity1_input", "45123"),
            ("humidity1_max", "80000"),
            ("humidity1_alarm", "0"),
            ("update_interval", "1000"),
            ("heater_enable", "0"),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../1-0044".into()));
    let d = t.chip(
        7,
        &format!("{i2c}/1-0040"),
        "hwmon/",
        &[
            ("name", "ina226"),
            ("in0_input", "2"),
            ("in0_crit", "81"),
            ("in0_crit_alarm", "0"),
            ("in1_input", "12025"),
            ("curr1_input", "1500"),
            ("power1_input", "18037500"),
            ("update_interval", "2"),
            ("shunt_resistor", "10000"),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../1-0040".into()));
    let d = t.chip(
        8,
        "LNXSYSTM:00/LNXSYBUS:00/ACPI000D:00",
        "hwmon/",
        &[
            ("name", "power_meter"),
            ("power1_average", "245000000"),
            ("power1_accuracy", "95000"),
            ("power1_average_interval", "300000"),
            ("power1_average_interval_min", "1000"),
            ("power1_average_interval_max", "3000000"),
            ("power1_is_battery", "0"),
            ("power1_model_number", "DELL-PSU-1"),
            ("power1_oem_info", "Dell Inc."),
        ],
    );
    t.links
        .push((format!("{d}/device"), "../../../ACPI000D:00".into()));
    let old = "platform/w83627ehf.2576";
    let d = t.chip(9, old, "hwmon/", &[]);
    t.links
        .push((format!("{d}/device"), "../../../w83627ehf.2576".into()));
    for (a, v) in [
        ("name", "w83627ehf"),
        ("fan1_input", "2000"),
        ("fan1_min", "1000"),
        ("fan1_div", "8"),
        ("in0_input", "1000"),
        ("temp1_input", "30000"),
        ("temp1_max", "80000"),
        ("temp1_max_hyst", "75000"),
        ("power/control", "auto"),
    ] {
        t.files
            .push((format!("devices/{old}/{a}"), format!("{v}\n")));
    }
    t.chip(10, "virtual/misc", "", &[("temp1_input", "55000")]);
    t.files
        .push(("class/hwmon/README".into(), "not a chip\n".into()));
    t.links.push((
        "class/hwmon/hwmon11".into(),
        "../../devices/gone/hwmon11".into(),
    ));
    t.write(root);
}

#[test]
fn hwmon_on_fixture_trees_serves_what_node_exporter_serves() {
    let _guard = uctel_tests::exclusive();
    let mut p = Pipeline::start();
    let full = p.path().join("hwmon-sys");
    hwmon_fixture(&full);
    // A host without hardware monitoring: no `class/hwmon` at all.
    let bare = p.path().join("bare-sys");
    std::fs::create_dir_all(bare.join("class")).unwrap_or_else(|e| panic!("{e}"));
    let cases = [("hwmon-full", &full), ("hwmon-bare", &bare)];
    let exporters: Vec<(SocketAddr, Daemon)> = cases
        .iter()
        .map(|(agent, sys)| {
            node_exporter::start(
                p.path(),
                &format!("node-exporter-{agent}"),
                &[
                    "--collector.disable-defaults".to_owned(),
                    "--collector.hwmon".to_owned(),
                    format!("--path.sysfs={}", sys.display()),
                ],
            )
        })
        .collect();
    for (agent, sys) in cases {
        let sys = sys.display().to_string();
        p.add_agent_with(agent, 0.0, 1.0, |y| {
            y.set("sources.host_metrics.sysfs_path", sys);
        });
    }
    // The same tree with `hwmon` turned off: none of its series.
    let off_sys = full.display().to_string();
    p.add_agent_with("hwmon-off", 0.0, 1.0, |y| {
        y.set("sources.host_metrics.sysfs_path", off_sys)
            .set("sources.host_metrics.disabled_collectors", vec!["hwmon"]);
    });
    let hwmon = |k: &str| {
        k.starts_with("node_hwmon_") || k == "node_scrape_collector_success{collector=\"hwmon\"}"
    };
    let collector = uctel_tests::wait_for(
        "the hwmon agents' series at the collector",
        Duration::from_secs(40),
        Duration::from_millis(500),
        || {
            let c = p.scrape()?;
            for agent in ["hwmon-full", "hwmon-bare"] {
                let at = series(&c, &["agent", "instance"], |s| {
                    s.label("agent") == Some(agent)
                });
                if !at.contains_key("node_scrape_collector_success{collector=\"hwmon\"}") {
                    return Err(format!("no hwmon success series yet for {agent}"));
                }
            }
            let off = series(&c, &["agent", "instance"], |s| {
                s.label("agent") == Some("hwmon-off")
            });
            if !off.contains_key("node_scrape_collector_success{collector=\"cpu\"}") {
                return Err("no series yet for hwmon-off".to_owned());
            }
            Ok(c)
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", p.collector.log_tail(20)));
    // One more interval, so every series of a collection has arrived.
    drop(collector);
    std::thread::sleep(Duration::from_millis(1500));
    let collector = p.scrape().unwrap_or_else(|e| panic!("{e}"));

    let collector_families = families(&collector.text);
    let mut diff = Vec::new();
    for ((agent, _), (addr, _)) in cases.iter().zip(&exporters) {
        let ne = scrape(*addr).unwrap_or_else(|e| panic!("{e}"));
        let want: BTreeMap<String, f64> = series(&ne, &[], |_| true)
            .into_iter()
            .filter(|(k, _)| hwmon(k))
            .collect();
        let ours: BTreeMap<String, f64> = series(&collector, &["agent", "instance"], |s| {
            s.label("agent") == Some(agent)
        })
        .into_iter()
        .filter(|(k, _)| hwmon(k))
        .collect();
        for (k, v) in &want {
            match ours.get(k) {
                None => diff.push(format!("{agent}: missing at the collector: {k} {v}")),
                Some(c) if !same(*c, *v) => {
                    diff.push(format!("{agent}: {k}: node_exporter {v}, collector {c}"))
                }
                Some(_) => {}
            }
        }
        for (k, v) in &ours {
            if !want.contains_key(k) {
                diff.push(format!("{agent}: only at the collector: {k} {v}"));
            }
        }
        let ne_families = families(&ne.text);
        for (family, (help, ty)) in ne_families.iter().filter(|(f, _)| hwmon(f)) {
            match collector_families.get(family) {
                None => diff.push(format!("{agent}: no family {family} at the collector")),
                Some((our_help, our_ty)) => {
                    if our_help != help {
                        diff.push(format!("{family} help {our_help:?}, want {help:?}"));
                    }
                    if our_ty != ty {
                        diff.push(format!("{family} type {our_ty}, want {ty}"));
                    }
                }
            }
        }
        println!(
            "{agent}: node_exporter {} hwmon series, collector {}, {} families",
            want.len(),
            ours.len(),
            ne_families.keys().filter(|f| hwmon(f)).count()
        );
    }
    let off: Vec<String> = series(&collector, &["agent", "instance"], |s| {
        s.label("agent") == Some("hwmon-off")
    })
    .into_keys()
    .filter(|k| hwmon(k) || k.contains("collector=\"hwmon\""))
    .collect();
    assert!(off.is_empty(), "hwmon-off serves {off:?}");
    assert!(
        diff.is_empty(),
        "{} differences:\n{}",
        diff.len(),
        diff.join("\n")
    );
    for agent in &mut p.agents {
        agent.daemon.stop(Duration::from_secs(20));
    }
    drop(exporters);
}
