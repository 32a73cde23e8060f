//! Host metrics against a fixture `/proc` + `/sys` tree and against this machine.

use std::fs;
use std::path::Path;

use uctel_agent::sources::host::{HostCollector, HostMetrics, HostMetricsConfig, HostPaths};
use uctel_protocol::payload::{Metric, MetricType};

fn write(path: &Path, contents: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir");
    }
    fs::write(path, contents).expect("write fixture");
}

/// The value of the one sample `name{labels}`; panics with the list of names if absent.
fn value(metrics: &[Metric], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Metric> = metrics
        .iter()
        .filter(|m| {
            m.name == name
                && m.labels.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| m.labels.iter().any(|l| l.name == *k && l.value == *v))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {name}{labels:?}, found {}",
        found.len()
    );
    found[0].value
}

fn kind(metrics: &[Metric], name: &str) -> MetricType {
    let m = metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name}"));
    MetricType::try_from(m.r#type).expect("valid type")
}

fn has(metrics: &[Metric], name: &str, label: (&str, &str)) -> bool {
    metrics.iter().any(|m| {
        m.name == name
            && m.labels
                .iter()
                .any(|l| l.name == label.0 && l.value == label.1)
    })
}

const STAT: &str = "cpu  300 20 100 5000 40 5 6 7 8 9
cpu0 100 10 50 2500 20 2 3 4 5 6
cpu2 200 10 50 2500 20 3 3 3 3 3
intr 123456 1 2 3
ctxt 987654
btime 1700000000
processes 4242
procs_running 3
procs_blocked 1
softirq 1 2 3
";

const MEMINFO: &str = "MemTotal:       16318412 kB
MemFree:         1000000 kB
MemAvailable:    8000000 kB
Buffers:          200000 kB
Cached:          3000000 kB
SwapTotal:       2097148 kB
SwapFree:        2097000 kB
Active(anon):      12345 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
";

const NETDEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0: 5000000   4000  1    2    3     4          5         6     7000000   8000  9    10   11    12      13         14
";

const DISKSTATS: &str = "   8       0 sda 100 10 2000 300 200 20 4000 500 1 600 700 5 6 7 8 9 10
   8       1 sda1 50 5 1000 150 100 10 2000 250 0 300 350
 254       0 vda 55960 7325 4553922 87267 11991 31183 7007736 41044 0 9964 129507
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0
";

fn fixture(root: &Path) -> HostMetricsConfig {
    let proc = root.join("proc");
    let sys = root.join("sys");
    write(&proc.join("stat"), STAT);
    write(&proc.join("loadavg"), "0.52 1.25 2.00 2/345 6789\n");
    write(&proc.join("meminfo"), MEMINFO);
    write(&proc.join("net/dev"), NETDEV);
    write(&proc.join("diskstats"), DISKSTATS);
    // The fixture root is a real directory, so statvfs works on it; /proc and a cgroup mount
    // must be excluded by node_exporter's default lists.
    let mountinfo = format!(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
         27 1 254:0 / {root} rw,relatime - ext4 /dev/vda rw\n\
         31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
         41 31 0:38 / /unified rw,relatime - cgroup2 cgroup2 rw\n\
         42 1 0:99 / /nonexistent-mount-point-for-test rw,relatime - ext4 /dev/vdb rw\n",
        root = root.display()
    );
    write(&proc.join("1/mountinfo"), &mountinfo);
    // The node_exporter collectors of `sources::node` (their unit tests check the series).
    write(&proc.join("sys/fs/file-nr"), "352\t0\t2466165\n");
    write(&proc.join("sys/kernel/random/entropy_avail"), "256\n");
    write(&proc.join("sys/kernel/random/poolsize"), "256\n");
    write(&proc.join("vmstat"), "nr_free_pages 5\npgfault 42\n");
    write(
        &proc.join("net/sockstat"),
        "sockets: used 3\nTCP: inuse 1 orphan 0 tw 0 alloc 1 mem 2\n",
    );
    write(
        &proc.join("net/netstat"),
        "TcpExt: ListenDrops\nTcpExt: 1\n",
    );
    write(&proc.join("net/snmp"), "Ip: Forwarding\nIp: 1\n");
    for resource in ["cpu", "io", "memory"] {
        write(
            &proc.join("pressure").join(resource),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n",
        );
    }
    let netfilter = proc.join("sys/net/netfilter");
    write(&netfilter.join("nf_conntrack_count"), "1\n");
    write(&netfilter.join("nf_conntrack_max"), "65536\n");
    write(
        &proc.join("net/stat/nf_conntrack"),
        &format!("entries found\n{}\n", ["00000001"; 17].join(" ")),
    );
    write(
        &proc.join("net/softnet_stat"),
        &format!("{}\n", ["00000001"; 9].join(" ")),
    );
    write(
        &proc.join("schedstat"),
        "version 15\ncpu0 0 0 0 0 0 0 10 20 30\n",
    );
    write(
        &proc.join("net/arp"),
        "IP address HW type Flags HW address Mask Device\n\
         10.0.0.1 0x1 0x2 02:00:00:00:00:01 * eth0\n",
    );
    write(
        &proc.join("mdstat"),
        "Personalities : [raid1]\nmd0 : active raid1 sdb1[1] sda1[0]\n      \
         248896 blocks [2/2] [UU]\n\nunused devices: <none>\n",
    );
    write(&sys.join("class/net/eth0/operstate"), "up\n");
    write(&sys.join("class/net/bonding_masters"), "bond0\n");
    write(&sys.join("class/net/bond0/bonding/slaves"), "eth0\n");
    write(
        &sys.join("class/net/bond0/lower_eth0/bonding_slave/mii_status"),
        "up\n",
    );
    write(&sys.join("class/net/eth0/mtu"), "1500\n");
    for (file, value) in [
        ("firmware_rev", "1.0"),
        ("model", "M"),
        ("serial", "S"),
        ("state", "live"),
    ] {
        write(
            &sys.join("class/nvme/nvme0").join(file),
            &format!("{value}\n"),
        );
    }

    // `udp_queues` with no sockets, `hwmon` with no chips.
    write(
        &proc.join("net/udp"),
        "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  \
         timeout inode ref pointer drops\n",
    );
    fs::create_dir_all(sys.join("class/hwmon")).expect("mkdir");

    let port = sys.join("class/infiniband/mlx5_0/ports/1");
    write(&sys.join("class/infiniband/mlx5_0/fw_ver"), "16.35.2000\n");
    write(&port.join("state"), "4: ACTIVE\n");
    write(&port.join("phys_state"), "5: LinkUp\n");
    write(&port.join("rate"), "100 Gb/sec (4X EDR)\n");
    write(&port.join("counters/port_rcv_data"), "1000\n");
    write(&port.join("hw_counters/out_of_buffer"), "17\n");

    HostMetricsConfig {
        paths: HostPaths {
            proc,
            sys,
            rootfs: "/".into(),
        },
        ticks_per_second: Some(100),
        // `os` reads `<rootfs>/etc/os-release`, and the rootfs here is the real `/`.
        disabled: vec![HostCollector::Os],
        ethtool: None,
    }
}

#[test]
fn fixture_tree_produces_node_exporter_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut host = HostMetrics::new(fixture(dir.path()));
    let c = host.collect();
    assert!(c.errors.is_empty(), "errors: {:?}", c.errors);
    let m = &c.metrics;

    // cpu: ticks / USER_HZ, ids taken from the text (cpu1 is offline).
    assert_eq!(
        value(
            m,
            "node_cpu_seconds_total",
            &[("cpu", "0"), ("mode", "user")]
        ),
        1.0
    );
    assert_eq!(
        value(
            m,
            "node_cpu_seconds_total",
            &[("cpu", "0"), ("mode", "idle")]
        ),
        25.0
    );
    assert_eq!(
        value(
            m,
            "node_cpu_seconds_total",
            &[("cpu", "2"), ("mode", "user")]
        ),
        2.0
    );
    assert_eq!(
        value(
            m,
            "node_cpu_seconds_total",
            &[("cpu", "2"), ("mode", "steal")]
        ),
        0.03
    );
    assert!(!has(m, "node_cpu_seconds_total", ("cpu", "1")));
    assert_eq!(
        value(
            m,
            "node_cpu_guest_seconds_total",
            &[("cpu", "0"), ("mode", "nice")]
        ),
        0.06
    );
    assert_eq!(kind(m, "node_cpu_seconds_total"), MetricType::Counter);
    assert_eq!(
        m.iter()
            .filter(|s| s.name == "node_cpu_seconds_total")
            .count(),
        16
    );

    // stat
    assert_eq!(value(m, "node_context_switches_total", &[]), 987654.0);
    assert_eq!(value(m, "node_boot_time_seconds", &[]), 1_700_000_000.0);
    assert_eq!(value(m, "node_forks_total", &[]), 4242.0);
    assert_eq!(value(m, "node_intr_total", &[]), 123456.0);
    assert_eq!(value(m, "node_procs_running", &[]), 3.0);
    assert_eq!(value(m, "node_procs_blocked", &[]), 1.0);
    assert_eq!(kind(m, "node_boot_time_seconds"), MetricType::Gauge);

    // loadavg
    assert_eq!(value(m, "node_load1", &[]), 0.52);
    assert_eq!(value(m, "node_load5", &[]), 1.25);
    assert_eq!(value(m, "node_load15", &[]), 2.0);

    // meminfo
    assert_eq!(
        value(m, "node_memory_MemTotal_bytes", &[]),
        16318412.0 * 1024.0
    );
    assert_eq!(
        value(m, "node_memory_MemAvailable_bytes", &[]),
        8000000.0 * 1024.0
    );
    assert_eq!(
        value(m, "node_memory_SwapFree_bytes", &[]),
        2097000.0 * 1024.0
    );
    assert_eq!(
        value(m, "node_memory_Active_anon_bytes", &[]),
        12345.0 * 1024.0
    );
    assert_eq!(value(m, "node_memory_HugePages_Total", &[]), 0.0);
    assert_eq!(kind(m, "node_memory_MemFree_bytes"), MetricType::Gauge);

    // netdev
    let eth0 = [("device", "eth0")];
    assert_eq!(
        value(m, "node_network_receive_bytes_total", &eth0),
        5_000_000.0
    );
    assert_eq!(
        value(m, "node_network_receive_packets_total", &eth0),
        4000.0
    );
    assert_eq!(value(m, "node_network_receive_errs_total", &eth0), 1.0);
    assert_eq!(value(m, "node_network_receive_drop_total", &eth0), 2.0);
    assert_eq!(
        value(m, "node_network_transmit_bytes_total", &eth0),
        7_000_000.0
    );
    assert_eq!(value(m, "node_network_transmit_drop_total", &eth0), 10.0);
    assert_eq!(value(m, "node_network_transmit_colls_total", &eth0), 12.0);
    assert_eq!(
        value(m, "node_network_receive_bytes_total", &[("device", "lo")]),
        1000.0
    );

    // diskstats: sectors*512, ms/1000, partitions and loop devices excluded.
    let sda = [("device", "sda")];
    assert_eq!(value(m, "node_disk_reads_completed_total", &sda), 100.0);
    assert_eq!(value(m, "node_disk_read_bytes_total", &sda), 2000.0 * 512.0);
    assert_eq!(
        value(m, "node_disk_written_bytes_total", &sda),
        4000.0 * 512.0
    );
    assert_eq!(value(m, "node_disk_writes_completed_total", &sda), 200.0);
    assert_eq!(value(m, "node_disk_io_time_seconds_total", &sda), 0.6);
    assert_eq!(value(m, "node_disk_io_now", &sda), 1.0);
    assert_eq!(value(m, "node_disk_discards_completed_total", &sda), 5.0);
    assert_eq!(value(m, "node_disk_flush_requests_total", &sda), 9.0);
    assert!(has(m, "node_disk_reads_completed_total", ("device", "vda")));
    assert!(
        !has(m, "node_disk_discards_completed_total", ("device", "vda")),
        "vda has only 11 fields"
    );
    assert!(!has(
        m,
        "node_disk_reads_completed_total",
        ("device", "sda1")
    ));
    assert!(!has(
        m,
        "node_disk_reads_completed_total",
        ("device", "loop0")
    ));

    // filesystem
    let root = dir.path().display().to_string();
    let labels = [
        ("device", "/dev/vda"),
        ("mountpoint", root.as_str()),
        ("fstype", "ext4"),
    ];
    assert!(value(m, "node_filesystem_size_bytes", &labels) > 0.0);
    assert!(
        value(m, "node_filesystem_avail_bytes", &labels)
            <= value(m, "node_filesystem_free_bytes", &labels)
    );
    assert_eq!(value(m, "node_filesystem_device_error", &labels), 0.0);
    assert!(!has(
        m,
        "node_filesystem_size_bytes",
        ("mountpoint", "/proc")
    ));
    assert!(!has(m, "node_filesystem_size_bytes", ("fstype", "cgroup2")));
    assert!(!has(
        m,
        "node_filesystem_size_bytes",
        ("mountpoint", "/sys/fs/cgroup")
    ));
    let missing = [
        ("device", "/dev/vdb"),
        ("mountpoint", "/nonexistent-mount-point-for-test"),
        ("fstype", "ext4"),
    ];
    assert_eq!(value(m, "node_filesystem_device_error", &missing), 1.0);
    assert!(!has(
        m,
        "node_filesystem_size_bytes",
        ("device", "/dev/vdb")
    ));

    // time
    assert!(value(m, "node_time_seconds", &[]) > 1_600_000_000.0);

    // infiniband, run as a host sub-collector.
    let port = [("device", "mlx5_0"), ("port", "1")];
    assert_eq!(
        value(m, "node_infiniband_port_data_received_bytes_total", &port),
        4000.0
    );
    assert_eq!(value(m, "node_infiniband_out_of_buffer", &port), 17.0);

    // arp, netclass, nvme, mdadm and bonding (thermal_zone and edac find no devices: success, no series).
    assert_eq!(value(m, "node_arp_entries", &[("device", "eth0")]), 1.0);
    assert_eq!(value(m, "node_network_up", &[("device", "eth0")]), 1.0);
    assert_eq!(
        value(m, "node_network_mtu_bytes", &[("device", "eth0")]),
        1500.0
    );
    assert!(has(m, "node_nvme_info", ("model", "M")));
    assert_eq!(value(m, "node_md_blocks", &[("device", "md0")]), 248896.0);
    assert_eq!(value(m, "node_bonding_active", &[("master", "bond0")]), 1.0);
    assert!(!m.iter().any(|s| s.name.starts_with("node_thermal_zone_")));

    // Every collector reports success (`ethtool` is off without its section); every sample
    // uses the frame timestamp.
    for c in HostCollector::ALL
        .into_iter()
        .filter(|c| *c != HostCollector::Os && *c != HostCollector::Ethtool)
    {
        assert_eq!(
            value(
                m,
                "node_scrape_collector_success",
                &[("collector", c.name())]
            ),
            1.0,
            "{c}"
        );
    }
    assert!(m.iter().all(|s| s.timestamp_ms == 0));
}

#[test]
fn failing_collector_is_reported_counted_and_does_not_stop_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = fixture(dir.path());
    fs::remove_file(config.paths.proc.join("meminfo")).expect("rm");
    fs::write(config.paths.proc.join("loadavg"), "not a load average\n").expect("write");
    let mut host = HostMetrics::new(config);

    for round in 1..=2u64 {
        let c = host.collect();
        let failed: Vec<HostCollector> = c.errors.iter().map(|e| e.collector).collect();
        assert_eq!(failed, vec![HostCollector::Loadavg, HostCollector::Meminfo]);
        assert!(
            c.errors[1].to_string().contains("meminfo"),
            "{}",
            c.errors[1]
        );
        assert_eq!(host.failures(HostCollector::Meminfo), round);
        assert_eq!(host.failures(HostCollector::Loadavg), round);
        assert_eq!(host.failures(HostCollector::Cpu), 0);
        let m = &c.metrics;
        assert_eq!(
            value(
                m,
                "node_scrape_collector_success",
                &[("collector", "meminfo")]
            ),
            0.0
        );
        assert_eq!(
            value(
                m,
                "node_scrape_collector_success",
                &[("collector", "netdev")]
            ),
            1.0
        );
        assert!(!m.iter().any(|s| s.name.starts_with("node_memory_")));
        assert!(!m.iter().any(|s| s.name.starts_with("node_load")));
        // The collectors after the failing ones still ran.
        assert!(has(
            m,
            "node_network_receive_bytes_total",
            ("device", "eth0")
        ));
        assert!(has(m, "node_disk_reads_completed_total", ("device", "sda")));
    }
}

#[test]
fn this_machine_yields_core_series() {
    let mut host = HostMetrics::default();
    let c = host.collect();
    let failed: Vec<HostCollector> = c.errors.iter().map(|e| e.collector).collect();
    for core in [
        HostCollector::Cpu,
        HostCollector::Stat,
        HostCollector::Loadavg,
        HostCollector::Meminfo,
        HostCollector::Netdev,
        HostCollector::Time,
    ] {
        assert!(!failed.contains(&core), "{core} failed: {:?}", c.errors);
    }
    let m = &c.metrics;
    assert!(has(m, "node_cpu_seconds_total", ("mode", "idle")));
    assert!(value(m, "node_memory_MemTotal_bytes", &[]) > 0.0);
    assert!(has(m, "node_network_receive_bytes_total", ("device", "lo")));
    assert!(value(m, "node_boot_time_seconds", &[]) > 0.0);
}

/// Mount points whose names hold a space, a tab, a newline or a backslash: the kernel writes
/// them into mountinfo as `\040`, `\011`, `\012`, `\134`; the `mountpoint` (and `device`)
/// label is the decoded path, as node_exporter reports it, and statvfs(2) runs on the decoded
/// path (sizes, `device_error` 0), where the undecoded one failed (`device_error` 1, no sizes).
#[test]
fn escaped_mount_points_in_mountinfo_are_decoded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = fixture(dir.path());
    let root = dir.path().join("mnt");
    let names = ["with space", "tab\there", "new\nline", "back\\slash"];
    let mut mountinfo = String::new();
    for (i, name) in names.iter().enumerate() {
        fs::create_dir_all(root.join(name)).expect("mkdir");
        let escaped = format!("{}/{name}", root.display())
            .replace('\\', "\\134")
            .replace(' ', "\\040")
            .replace('\t', "\\011")
            .replace('\n', "\\012");
        mountinfo.push_str(&format!(
            "{} 1 0:{} / {escaped} rw,relatime - ext4 /dev/disk\\040{i} rw\n",
            50 + i,
            60 + i
        ));
    }
    write(&config.paths.proc.join("1/mountinfo"), &mountinfo);
    config.disabled = HostCollector::ALL
        .into_iter()
        .filter(|c| *c != HostCollector::Filesystem)
        .collect();
    let c = HostMetrics::new(config).collect();
    assert!(c.errors.is_empty(), "errors: {:?}", c.errors);
    for (i, name) in names.iter().enumerate() {
        let mount_point = format!("{}/{name}", root.display());
        let device = format!("/dev/disk {i}");
        let labels = [
            ("device", device.as_str()),
            ("mountpoint", mount_point.as_str()),
            ("fstype", "ext4"),
        ];
        assert_eq!(
            value(&c.metrics, "node_filesystem_device_error", &labels),
            0.0,
            "{name:?}"
        );
        assert!(value(&c.metrics, "node_filesystem_size_bytes", &labels) > 0.0);
    }
}

/// Unmounts its mount point when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The same through the kernel: a 1 MiB tmpfs mounted on a directory named `a b\c` under a
/// temporary directory (as root; skipped with a note where mount(8) is refused) is reported
/// under its real path with its real size, from this machine's `/proc/1/mountinfo`.
#[test]
fn a_real_mount_point_with_a_space_and_a_backslash_is_reported_under_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let point = dir.path().join("a b\\c");
    fs::create_dir(&point).expect("mkdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "uctel-test"])
        .arg(&point)
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!("skipped: cannot mount a tmpfs here (needs root): {other:?}");
            return;
        }
    }
    let _guard = Mounted(point.clone());
    let mut host = HostMetrics::new(HostMetricsConfig {
        disabled: HostCollector::ALL
            .into_iter()
            .filter(|c| *c != HostCollector::Filesystem)
            .collect(),
        ..HostMetricsConfig::default()
    });
    let c = host.collect();
    assert!(c.errors.is_empty(), "errors: {:?}", c.errors);
    let mount_point = point.to_str().expect("utf-8 path");
    let labels = [
        ("device", "uctel-test"),
        ("mountpoint", mount_point),
        ("fstype", "tmpfs"),
    ];
    assert_eq!(
        value(&c.metrics, "node_filesystem_device_error", &labels),
        0.0
    );
    assert_eq!(
        value(&c.metrics, "node_filesystem_size_bytes", &labels),
        1048576.0
    );
}
