//! The smaller node_exporter collectors that [`crate::sources::host::HostMetrics`] runs: each
//! function reads one or a few kernel files and appends node_exporter's series for them.
//!
//! Names, help strings, types and value decoding follow node_exporter 1.5's
//! `collector/{filefd,uname,entropy,vmstat,sockstat,netstat,pressure,os_release,conntrack,
//! softnet,schedstat}_linux.go` and the parsers of its `procfs` library. Where node_exporter
//! skips a file that is absent (`sockstat6` and `snmp6` without IPv6), so does this module;
//! where node_exporter reports "no data" (no conntrack module, no PSI, no os-release, no
//! schedstat), the function fails and the collector's `node_scrape_collector_success` is 0.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use regex::Regex;
use uctel_protocol::payload::{Metric, MetricType};

use super::metric::{counter, gauge, sample};

/// Why one of these collectors failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents did not have the expected shape.
    #[error("unexpected contents in {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
}

/// A kernel file's text, read with plain read(2)s into a buffer sized for a sysfs page.
/// `std::fs::read_to_string` would first ask statx(2) and lseek(2) for a size that pseudo
/// files do not have (procfs and sysfs report 0 or 4096), two system calls per file of
/// every collection.
///
/// # Errors
/// Opening or reading fails, or the text is not UTF-8 (`InvalidData`).
pub(super) fn read_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut text = String::with_capacity(4096);
    file.take(u64::MAX).read_to_string(&mut text)?;
    Ok(text)
}

pub(super) fn read(path: &Path) -> Result<String, NodeError> {
    read_text(path).map_err(|source| NodeError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The file, or `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, NodeError> {
    match read_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(NodeError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

pub(super) fn format_error(path: &Path, reason: impl Into<String>) -> NodeError {
    NodeError::Format {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// A file holding one unsigned decimal number (procfs' `ReadUintFromFile`).
fn read_uint(path: &Path) -> Result<u64, NodeError> {
    let text = read(path)?;
    text.trim()
        .parse()
        .map_err(|_| format_error(path, format!("not an unsigned integer: {:?}", text.trim())))
}

fn untyped(name: String, help: &str, value: f64) -> Metric {
    sample(name, help, MetricType::Untyped, &[], value)
}

/// `filefd`: `<proc>/sys/fs/file-nr` → `node_filefd_allocated`, `node_filefd_maximum`.
pub fn filefd(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("sys/fs/file-nr");
    let text = read(&path)?;
    // At least three numbers (node_exporter splits on tabs and needs three); the second is
    // always 0 since Linux 2.6.
    let fields: Vec<&str> = text.split_whitespace().collect();
    let (Some(&allocated), Some(&maximum)) = (fields.first(), fields.get(2)) else {
        return Err(format_error(&path, "expected 3 numbers"));
    };
    for (name, value) in [("allocated", allocated), ("maximum", maximum)] {
        let v: f64 = value
            .parse()
            .map_err(|_| format_error(&path, format!("not a number: {value:?}")))?;
        out.push(gauge(
            format!("node_filefd_{name}"),
            &format!("File descriptor statistics: {name}."),
            &[],
            v,
        ));
    }
    Ok(())
}

/// `uname`: uname(2) → `node_uname_info{sysname,release,version,machine,nodename,domainname}`.
pub fn uname(out: &mut Vec<Metric>) {
    let u = rustix::system::uname();
    let text = |s: &std::ffi::CStr| s.to_string_lossy().into_owned();
    let (sysname, release, version) = (text(u.sysname()), text(u.release()), text(u.version()));
    let (machine, nodename) = (text(u.machine()), text(u.nodename()));
    let domainname = text(u.domainname());
    out.push(gauge(
        "node_uname_info",
        "Labeled system information as provided by the uname system call.",
        &[
            ("sysname", &sysname),
            ("release", &release),
            ("version", &version),
            ("machine", &machine),
            ("nodename", &nodename),
            ("domainname", &domainname),
        ],
        1.0,
    ));
}

/// `entropy`: `<proc>/sys/kernel/random/{entropy_avail,poolsize}`.
pub fn entropy(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let dir = proc.join("sys/kernel/random");
    let avail = read_uint(&dir.join("entropy_avail"))?;
    let pool = read_uint(&dir.join("poolsize"))?;
    out.push(gauge(
        "node_entropy_available_bits",
        "Bits of available entropy.",
        &[],
        avail as f64,
    ));
    out.push(gauge(
        "node_entropy_pool_size_bits",
        "Bits of entropy pool.",
        &[],
        pool as f64,
    ));
    Ok(())
}

/// node_exporter's default `--collector.vmstat.fields`, `^(oom_kill|pgpg|pswp|pg.*fault).*`.
pub fn vmstat_field_selected(name: &str) -> bool {
    name.starts_with("oom_kill")
        || name.starts_with("pgpg")
        || name.starts_with("pswp")
        || name
            .strip_prefix("pg")
            .is_some_and(|rest| rest.contains("fault"))
}

/// `vmstat`: `<proc>/vmstat` → `node_vmstat_<field>` (untyped) for the default fields.
pub fn vmstat(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("vmstat");
    let text = read(&path)?;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
            return Err(format_error(&path, format!("bad line {line:?}")));
        };
        let v: f64 = value
            .parse()
            .map_err(|_| format_error(&path, format!("bad value in {line:?}")))?;
        if !vmstat_field_selected(name) {
            continue;
        }
        out.push(untyped(
            format!("node_vmstat_{name}"),
            &format!("/proc/vmstat information field {name}."),
            v,
        ));
    }
    Ok(())
}

/// `sockstat`: `<proc>/net/sockstat` and `<proc>/net/sockstat6` → `node_sockstat_sockets_used`
/// and `node_sockstat_<PROTO>_<field>` (plus `_mem_bytes`, `mem` × `page_size`). A file that
/// does not exist (IPv4 or IPv6 disabled) is skipped, as node_exporter does.
pub fn sockstat(proc: &Path, page_size: u64, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    for (file, v6) in [("sockstat", false), ("sockstat6", true)] {
        let path = proc.join("net").join(file);
        if let Some(text) = read_optional(&path)? {
            sockstat_file(&path, &text, v6, page_size, out)?;
        }
    }
    Ok(())
}

const SOCKSTAT_FIELDS: [&str; 6] = ["inuse", "orphan", "tw", "alloc", "mem", "memory"];

fn sockstat_file(
    path: &Path,
    text: &str,
    v6: bool,
    page_size: u64,
    out: &mut Vec<Metric>,
) -> Result<(), NodeError> {
    let int = |s: &str| {
        s.parse::<i64>()
            .map_err(|_| format_error(path, format!("not an integer: {s:?}")))
    };
    // As the procfs library: fields split on single spaces, a name and at least one pair.
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some((first, kvs)), true) = (fields.split_first(), fields.len() >= 3) else {
            return Err(format_error(path, format!("malformed line {line:?}")));
        };
        if kvs.len() % 2 != 0 {
            return Err(format_error(path, format!("odd field count in {line:?}")));
        }
        let proto = first.strip_suffix(':').unwrap_or(first);
        let mut values: [Option<i64>; 6] = [None; 6];
        let mut used = 0;
        for pair in kvs.chunks(2) {
            let v = int(pair[1])?;
            if let Some(i) = SOCKSTAT_FIELDS.iter().position(|f| *f == pair[0]) {
                values[i] = Some(v);
            } else if pair[0] == "used" {
                used = v;
            }
        }
        if proto == "sockets" {
            if !v6 {
                out.push(gauge(
                    "node_sockstat_sockets_used",
                    "Number of IPv4 sockets in use.",
                    &[],
                    used as f64,
                ));
            }
            continue;
        }
        // `inuse` is always exported (0 when absent), as the procfs library reads it.
        values[0] = Some(values[0].unwrap_or(0));
        let mem_bytes = values[4].map(|pages| pages * page_size as i64);
        let named = SOCKSTAT_FIELDS
            .iter()
            .zip(values)
            .chain(std::iter::once((&"mem_bytes", mem_bytes)));
        for (field, value) in named {
            if let Some(v) = value {
                out.push(gauge(
                    format!("node_sockstat_{proto}_{field}"),
                    &format!("Number of {proto} sockets in state {field}."),
                    &[],
                    v as f64,
                ));
            }
        }
    }
    Ok(())
}

/// node_exporter 1.5's default `--collector.netstat.fields`.
const NETSTAT_FIELDS: &str = "^(.*_(InErrors|InErrs)|Ip_Forwarding|Ip(6|Ext)_(InOctets|OutOctets)|Icmp6?_(InMsgs|OutMsgs)|TcpExt_(Listen.*|Syncookies.*|TCPSynRetrans|TCPTimeouts)|Tcp_(ActiveOpens|InSegs|OutSegs|OutRsts|PassiveOpens|RetransSegs|CurrEstab)|Udp6?_(InDatagrams|OutDatagrams|NoPorts|RcvbufErrors|SndbufErrors))$";

/// Whether `<Protocol>_<Field>` is in node_exporter's default netstat field set.
pub fn netstat_field_selected(key: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| Regex::new(NETSTAT_FIELDS).ok())
        .as_ref()
        .is_some_and(|re| re.is_match(key))
}

type NetStats = BTreeMap<String, BTreeMap<String, String>>;

/// `Proto: names…` / `Proto: values…` line pairs (`net/netstat`, `net/snmp`).
fn parse_net_stats(path: &Path, text: &str, into: &mut NetStats) -> Result<(), NodeError> {
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next().unwrap_or("");
        let names: Vec<&str> = names.split(' ').collect();
        let values: Vec<&str> = values.split(' ').collect();
        let proto = names[0].strip_suffix(':').unwrap_or(names[0]);
        if names.len() != values.len() {
            return Err(format_error(path, format!("field count mismatch: {proto}")));
        }
        let fields = names.iter().zip(&values).skip(1);
        let map = fields.map(|(n, v)| ((*n).to_owned(), (*v).to_owned()));
        into.insert(proto.to_owned(), map.collect());
    }
    Ok(())
}

/// `Ip6InReceives 12` lines (`net/snmp6`): the protocol is the name up to its first `6`.
fn parse_snmp6(text: &str, into: &mut NetStats) {
    let mut v6 = NetStats::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 2 {
            continue;
        }
        if let Some(i) = fields[0].find('6') {
            let (proto, name) = fields[0].split_at(i + 1);
            let stats = v6.entry(proto.to_owned()).or_default();
            stats.insert(name.to_owned(), fields[1].to_owned());
        }
    }
    into.extend(v6);
}

/// `netstat`: `<proc>/net/{netstat,snmp,snmp6}` → `node_netstat_<Proto>_<Field>` (untyped)
/// for the default fields; `snmp6` is skipped when it does not exist (IPv6 disabled).
pub fn netstat(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let mut stats = NetStats::new();
    for file in ["netstat", "snmp"] {
        let path = proc.join("net").join(file);
        parse_net_stats(&path, &read(&path)?, &mut stats)?;
    }
    let snmp6 = proc.join("net/snmp6");
    if let Some(text) = read_optional(&snmp6)? {
        parse_snmp6(&text, &mut stats);
    }
    for (proto, fields) in &stats {
        for (name, value) in fields {
            let key = format!("{proto}_{name}");
            let v: f64 = value.parse().map_err(|_| {
                format_error(
                    &proc.join("net"),
                    format!("invalid value {value} in netstats"),
                )
            })?;
            if netstat_field_selected(&key) {
                let help = format!("Statistic {proto}{name}.");
                out.push(untyped(format!("node_netstat_{key}"), &help, v));
            }
        }
    }
    Ok(())
}

/// The `some` and `full` `total=` microseconds of a PSI file (`full` absent for `cpu` on
/// older kernels).
fn psi_totals(path: &Path, text: &str) -> Result<(Option<u64>, Option<u64>), NodeError> {
    let (mut some, mut full) = (None, None);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let bad = || format_error(path, format!("bad line {line:?}"));
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [kind, a10, a60, a300, total] = fields[..] else {
            return Err(bad());
        };
        for (field, key) in [(a10, "avg10="), (a60, "avg60="), (a300, "avg300=")] {
            let ok = field.strip_prefix(key).and_then(|v| v.parse::<f64>().ok());
            ok.ok_or_else(bad)?;
        }
        let total = total
            .strip_prefix("total=")
            .and_then(|v| v.parse::<u64>().ok());
        let total = total.ok_or_else(bad)?;
        match kind {
            "some" => some = Some(total),
            "full" => full = Some(total),
            _ => return Err(bad()),
        }
    }
    Ok((some, full))
}

/// `pressure`: `<proc>/pressure/{cpu,io,memory}` → `node_pressure_*_seconds_total`.
pub fn pressure(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    // node_exporter divides the microseconds by 1000 twice; doing the same keeps the last bit.
    let seconds = |us: Option<u64>| us.unwrap_or(0) as f64 / 1000.0 / 1000.0;
    for resource in ["cpu", "io", "memory"] {
        let path = proc.join("pressure").join(resource);
        let (some, full) = psi_totals(&path, &read(&path)?)?;
        let series: &[(&str, &str, Option<u64>)] = match resource {
            "cpu" => &[(
                "node_pressure_cpu_waiting_seconds_total",
                "Total time in seconds that processes have waited for CPU time",
                some,
            )],
            "io" => &[
                (
                    "node_pressure_io_waiting_seconds_total",
                    "Total time in seconds that processes have waited due to IO congestion",
                    some,
                ),
                (
                    "node_pressure_io_stalled_seconds_total",
                    "Total time in seconds no process could make progress due to IO congestion",
                    full,
                ),
            ],
            _ => &[
                (
                    "node_pressure_memory_waiting_seconds_total",
                    "Total time in seconds that processes have waited for memory",
                    some,
                ),
                (
                    "node_pressure_memory_stalled_seconds_total",
                    "Total time in seconds no process could make progress due to memory congestion",
                    full,
                ),
            ],
        };
        for (name, help, us) in series {
            out.push(counter(*name, help, &[], seconds(*us)));
        }
    }
    Ok(())
}

/// One os-release value: `"…"` with `\` escapes, `'…'` literal, or bare.
fn os_release_value(raw: &str) -> String {
    let raw = raw.trim();
    if let Some(inner) = raw.strip_prefix('\'') {
        return inner.split('\'').next().unwrap_or("").to_owned();
    }
    let (quoted, body) = match raw.strip_prefix('"') {
        Some(inner) => (true, inner),
        None => (false, raw),
    };
    let mut value = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => value.extend(chars.next()),
            '"' if quoted => break,
            c => value.push(c),
        }
    }
    value
}

/// `KEY=value` pairs of an os-release file.
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        if let Some((key, value)) = line.split_once('=') {
            env.insert(key.trim().to_owned(), os_release_value(value));
        }
    }
    env
}

/// `os`: `<rootfs>/etc/os-release` (fallback `<rootfs>/usr/lib/os-release`) →
/// `node_os_info{…}` and, when `VERSION_ID` starts with a number, `node_os_version`.
pub fn os(rootfs: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let etc = rootfs.join("etc/os-release");
    let text = match read_optional(&etc)? {
        Some(text) => text,
        None => read(&rootfs.join("usr/lib/os-release"))?,
    };
    let env = parse_os_release(&text);
    let get = |k: &str| env.get(k).map_or("", String::as_str);
    const INFO: [(&str, &str); 12] = [
        ("build_id", "BUILD_ID"),
        ("id", "ID"),
        ("id_like", "ID_LIKE"),
        ("image_id", "IMAGE_ID"),
        ("image_version", "IMAGE_VERSION"),
        ("name", "NAME"),
        ("pretty_name", "PRETTY_NAME"),
        ("variant", "VARIANT"),
        ("variant_id", "VARIANT_ID"),
        ("version", "VERSION"),
        ("version_codename", "VERSION_CODENAME"),
        ("version_id", "VERSION_ID"),
    ];
    let labels: Vec<(&str, &str)> = INFO.iter().map(|(l, k)| (*l, get(k))).collect();
    out.push(gauge(
        "node_os_info",
        "A metric with a constant '1' value labeled by build_id, id, id_like, image_id, \
         image_version, name, pretty_name, variant, variant_id, version, version_codename, \
         version_id.",
        &labels,
        1.0,
    ));
    let version = os_version(get("VERSION_ID"));
    if version > 0.0 {
        out.push(gauge(
            "node_os_version",
            "Metric containing the major.minor part of the OS version.",
            &[
                ("id", get("ID")),
                ("id_like", get("ID_LIKE")),
                ("name", get("NAME")),
            ],
            version,
        ));
    }
    Ok(())
}

/// The `^[0-9]+\.?[0-9]*` prefix of `VERSION_ID` as a number, 0 when there is none.
pub fn os_version(version_id: &str) -> f64 {
    let int = version_id.bytes().take_while(u8::is_ascii_digit).count();
    if int == 0 {
        return 0.0;
    }
    let mut end = int;
    if version_id.as_bytes().get(end) == Some(&b'.') {
        end += 1;
        end += version_id[end..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
    }
    version_id[..end].parse().unwrap_or(0.0)
}

/// `conntrack`: `<proc>/sys/net/netfilter/nf_conntrack_{count,max}` and the per-CPU
/// `<proc>/net/stat/nf_conntrack` table summed over CPUs → `node_nf_conntrack_*`.
pub fn conntrack(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let dir = proc.join("sys/net/netfilter");
    let count = read_uint(&dir.join("nf_conntrack_count"))?;
    let max = read_uint(&dir.join("nf_conntrack_max"))?;
    let path = proc.join("net/stat/nf_conntrack");
    let text = read(&path)?;
    // Columns of the table as the procfs library reads them (by position, 17 per row).
    const STATS: [(usize, &str, &str); 8] = [
        (2, "found", "Number of searched entries which were successful."),
        (4, "invalid", "Number of packets seen which can not be tracked."),
        (5, "ignore", "Number of packets seen which are already connected to a conntrack entry."),
        (8, "insert", "Number of entries inserted into the list."),
        (9, "insert_failed", "Number of entries for which list insertion was attempted but failed."),
        (10, "drop", "Number of packets dropped due to conntrack failure."),
        (11, "early_drop", "Number of dropped conntrack entries to make room for new ones, if maximum table size was reached."),
        (16, "search_restart", "Number of conntrack table lookups which had to be restarted due to hashtable resizes."),
    ];
    let mut sums = [0u64; STATS.len()];
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 17 {
            return Err(format_error(&path, format!("bad row {line:?}")));
        }
        for (sum, (col, _, _)) in sums.iter_mut().zip(STATS) {
            let v = u64::from_str_radix(fields[col], 16)
                .map_err(|_| format_error(&path, format!("bad hex in {line:?}")))?;
            *sum = sum.wrapping_add(v);
        }
    }
    out.push(gauge(
        "node_nf_conntrack_entries",
        "Number of currently allocated flow entries for connection tracking.",
        &[],
        count as f64,
    ));
    out.push(gauge(
        "node_nf_conntrack_entries_limit",
        "Maximum size of connection tracking table.",
        &[],
        max as f64,
    ));
    for (sum, (_, name, help)) in sums.iter().zip(STATS) {
        let name = format!("node_nf_conntrack_stat_{name}");
        out.push(gauge(name, help, &[], *sum as f64));
    }
    Ok(())
}

/// `softnet`: `<proc>/net/softnet_stat` (one hex row per CPU, `cpu` = row number) →
/// `node_softnet_{processed,dropped,times_squeezed}_total{cpu}`.
pub fn softnet(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    let path = proc.join("net/softnet_stat");
    let text = read(&path)?;
    const SERIES: [(&str, &str); 3] = [
        (
            "node_softnet_processed_total",
            "Number of processed packets",
        ),
        ("node_softnet_dropped_total", "Number of dropped packets"),
        (
            "node_softnet_times_squeezed_total",
            "Number of times processing packets ran out of quota",
        ),
    ];
    for (cpu, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9 {
            return Err(format_error(
                &path,
                format!("{} columns, want 9", fields.len()),
            ));
        }
        let mut values = [0u32; 9];
        for (v, f) in values.iter_mut().zip(&fields) {
            *v = u32::from_str_radix(f, 16)
                .map_err(|_| format_error(&path, format!("bad hex in {line:?}")))?;
        }
        let cpu = cpu.to_string();
        for ((name, help), v) in SERIES.iter().zip(values) {
            out.push(counter(*name, help, &[("cpu", &cpu)], f64::from(v)));
        }
    }
    Ok(())
}

/// `schedstat`: the `cpuN …` lines of `<proc>/schedstat` (the procfs library's unanchored
/// `cpu(\d+)` followed by nine numbers; other lines skipped) →
/// `node_schedstat_{running_seconds,waiting_seconds,timeslices}_total{cpu}` (nanoseconds / 10⁹).
pub fn schedstat(proc: &Path, out: &mut Vec<Metric>) -> Result<(), NodeError> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let path = proc.join("schedstat");
    let text = read(&path)?;
    let re = RE
        .get_or_init(|| {
            Regex::new(r"cpu(\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)").ok()
        })
        .as_ref()
        .ok_or_else(|| format_error(&path, "pattern"))?;
    for line in text.lines() {
        let Some(m) = re.captures(line) else {
            continue;
        };
        let num = |i: usize| m.get(i).and_then(|g| g.as_str().parse::<u64>().ok());
        let (Some(running), Some(waiting), Some(slices)) = (num(8), num(9), num(10)) else {
            continue; // out of range: skipped, as the procfs library does
        };
        let cpu = [("cpu", m.get(1).map_or("", |g| g.as_str()))];
        out.push(counter(
            "node_schedstat_running_seconds_total",
            "Number of seconds CPU spent running a process.",
            &cpu,
            running as f64 / 1e9,
        ));
        out.push(counter(
            "node_schedstat_waiting_seconds_total",
            "Number of seconds spent by processing waiting for this CPU.",
            &cpu,
            waiting as f64 / 1e9,
        ));
        out.push(counter(
            "node_schedstat_timeslices_total",
            "Number of timeslices executed by CPU.",
            &cpu,
            slices as f64,
        ));
    }
    Ok(())
}

/// SELinux enforcement modes as node_exporter exports them: 1 enforcing, 0 permissive, -1
/// disabled (go-selinux's `Enforcing`, `Permissive`, `Disabled`).
fn selinux_mode(word: &str) -> f64 {
    match word.trim() {
        "enforcing" | "1" => 1.0,
        "permissive" | "0" => 0.0,
        _ => -1.0,
    }
}

/// `selinux`: `node_selinux_enabled` (1 when selinuxfs is mounted at `<sys>/fs/selinux` and
/// this process has an SELinux label other than `kernel` in `/proc/self/attr/current`, the
/// test go-selinux makes for node_exporter's `selinux_linux.go`), and when enabled
/// `node_selinux_config_mode` (`SELINUX=` of `<rootfs>/etc/selinux/config`) and
/// `node_selinux_current_mode` (`<sys>/fs/selinux/enforce`), as 1 enforcing, 0 permissive,
/// -1 disabled. Never fails: a host without SELinux has `node_selinux_enabled 0`.
pub fn selinux(sys: &Path, rootfs: &Path, out: &mut Vec<Metric>) {
    let enforce = std::fs::read_to_string(sys.join("fs/selinux/enforce")).ok();
    let label = std::fs::read_to_string("/proc/self/attr/current").ok();
    let labelled = label
        .as_deref()
        .map(|l| l.trim_end_matches(['\0', '\n']))
        .is_some_and(|l| !l.is_empty() && l != "kernel");
    let Some(enforce) = enforce.filter(|_| labelled) else {
        out.push(gauge(
            "node_selinux_enabled",
            "SELinux is enabled, 1 is true, 0 is false",
            &[],
            0.0,
        ));
        return;
    };
    out.push(gauge(
        "node_selinux_enabled",
        "SELinux is enabled, 1 is true, 0 is false",
        &[],
        1.0,
    ));
    let config = std::fs::read_to_string(rootfs.join("etc/selinux/config")).unwrap_or_default();
    let configured = config
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
        .find_map(|l| l.strip_prefix("SELINUX="))
        .map_or(-1.0, |v| selinux_mode(v.trim_matches('"')));
    out.push(gauge(
        "node_selinux_config_mode",
        "Configured SELinux enforcement mode",
        &[],
        configured,
    ));
    out.push(gauge(
        "node_selinux_current_mode",
        "Current SELinux enforcement mode",
        &[],
        selinux_mode(&enforce),
    ));
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A tempdir laid out like `/proc` with `files` (relative path, contents).
    pub(in crate::sources) fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for (rel, text) in files {
            let path = dir.path().join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
            }
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        }
        dir
    }

    /// `name{k="v",…} type value` lines of `m`, in order.
    pub(in crate::sources) fn lines(m: &[Metric]) -> Vec<String> {
        m.iter()
            .map(|s| {
                let labels: Vec<String> = s
                    .labels
                    .iter()
                    .map(|l| format!("{}={:?}", l.name, l.value))
                    .collect();
                let ty = match MetricType::try_from(s.r#type) {
                    Ok(MetricType::Counter) => "counter",
                    Ok(MetricType::Gauge) => "gauge",
                    Ok(MetricType::Untyped) => "untyped",
                    _ => "other",
                };
                format!("{}{{{}}} {ty} {}", s.name, labels.join(","), s.value)
            })
            .collect()
    }

    pub(in crate::sources) fn help_of<'a>(m: &'a [Metric], name: &str) -> Option<&'a str> {
        m.iter().find(|s| s.name == name).map(|s| s.help.as_str())
    }

    #[test]
    fn selinux_is_disabled_without_selinuxfs_and_reads_modes_with_it() {
        let d = tree(&[]);
        let mut out = Vec::new();
        selinux(d.path(), d.path(), &mut out);
        assert_eq!(lines(&out), ["node_selinux_enabled{} gauge 0"]);
        assert_eq!(selinux_mode("enforcing"), 1.0);
        assert_eq!(selinux_mode("0\n"), 0.0);
        assert_eq!(selinux_mode("disabled"), -1.0);
        assert_eq!(selinux_mode("garbage"), -1.0);
    }

    #[test]
    fn filefd_exports_allocated_and_maximum() {
        let d = tree(&[("sys/fs/file-nr", "352\t0\t2466165\n")]);
        let mut out = Vec::new();
        filefd(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_filefd_allocated{} gauge 352",
                "node_filefd_maximum{} gauge 2466165"
            ]
        );
        assert_eq!(
            help_of(&out, "node_filefd_maximum"),
            Some("File descriptor statistics: maximum.")
        );
        let bad = tree(&[("sys/fs/file-nr", "352 0\n")]);
        assert!(matches!(
            filefd(bad.path(), &mut Vec::new()),
            Err(NodeError::Format { .. })
        ));
        let empty = tree(&[]);
        assert!(matches!(
            filefd(empty.path(), &mut Vec::new()),
            Err(NodeError::Read { .. })
        ));
    }

    #[test]
    fn uname_has_the_six_labels_of_the_system_call() {
        let mut out = Vec::new();
        uname(&mut out);
        assert_eq!(out.len(), 1);
        let names: Vec<&str> = out[0].labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sysname",
                "release",
                "version",
                "machine",
                "nodename",
                "domainname"
            ]
        );
        assert_eq!(out[0].value, 1.0);
        assert_eq!(out[0].labels[0].value, "Linux");
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        assert_eq!(out[0].labels[1].value, release.trim());
    }

    #[test]
    fn entropy_needs_both_files() {
        let d = tree(&[
            ("sys/kernel/random/entropy_avail", "256\n"),
            ("sys/kernel/random/poolsize", "4096\n"),
        ]);
        let mut out = Vec::new();
        entropy(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_entropy_available_bits{} gauge 256",
                "node_entropy_pool_size_bits{} gauge 4096"
            ]
        );
        let half = tree(&[("sys/kernel/random/entropy_avail", "256\n")]);
        assert!(entropy(half.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn vmstat_keeps_the_default_fields_untyped() {
        let d = tree(&[(
            "vmstat",
            "nr_free_pages 500023\npgpgin 115142789\npgpgout 568390820\npswpin 0\npswpout 7\n\
             pgfault 1355172436\npgmajfault 249084\npgfree 12\nthp_fault_alloc 3\n\
             pgdemote_kswapd 1\npgscan_fault_x 5\noom_kill 2\noom_kill_extra 4\n",
        )]);
        let mut out = Vec::new();
        vmstat(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_vmstat_pgpgin{} untyped 115142789",
                "node_vmstat_pgpgout{} untyped 568390820",
                "node_vmstat_pswpin{} untyped 0",
                "node_vmstat_pswpout{} untyped 7",
                "node_vmstat_pgfault{} untyped 1355172436",
                "node_vmstat_pgmajfault{} untyped 249084",
                "node_vmstat_pgscan_fault_x{} untyped 5",
                "node_vmstat_oom_kill{} untyped 2",
                "node_vmstat_oom_kill_extra{} untyped 4",
            ]
        );
        assert_eq!(
            help_of(&out, "node_vmstat_pgfault"),
            Some("/proc/vmstat information field pgfault.")
        );
        let bad = tree(&[("vmstat", "pgfault x\n")]);
        assert!(vmstat(bad.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn sockstat_reads_v4_and_v6_with_mem_bytes() {
        let d = tree(&[
            (
                "net/sockstat",
                "sockets: used 15\nTCP: inuse 2 orphan 1 tw 3 alloc 4 mem 20\nUDP: inuse 0 mem 196\n\
                 FRAG: inuse 0 memory 0\n",
            ),
            ("net/sockstat6", "TCP6: inuse 5\nFRAG6: inuse 0 memory 7\n"),
        ]);
        let mut out = Vec::new();
        sockstat(d.path(), 4096, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_sockstat_sockets_used{} gauge 15",
                "node_sockstat_TCP_inuse{} gauge 2",
                "node_sockstat_TCP_orphan{} gauge 1",
                "node_sockstat_TCP_tw{} gauge 3",
                "node_sockstat_TCP_alloc{} gauge 4",
                "node_sockstat_TCP_mem{} gauge 20",
                "node_sockstat_TCP_mem_bytes{} gauge 81920",
                "node_sockstat_UDP_inuse{} gauge 0",
                "node_sockstat_UDP_mem{} gauge 196",
                "node_sockstat_UDP_mem_bytes{} gauge 802816",
                "node_sockstat_FRAG_inuse{} gauge 0",
                "node_sockstat_FRAG_memory{} gauge 0",
                "node_sockstat_TCP6_inuse{} gauge 5",
                "node_sockstat_FRAG6_inuse{} gauge 0",
                "node_sockstat_FRAG6_memory{} gauge 7",
            ]
        );
        assert_eq!(
            help_of(&out, "node_sockstat_TCP_mem_bytes"),
            Some("Number of TCP sockets in state mem_bytes.")
        );
        assert_eq!(
            help_of(&out, "node_sockstat_sockets_used"),
            Some("Number of IPv4 sockets in use.")
        );
        // IPv6 disabled: no sockstat6, the IPv4 series only.
        let v4 = tree(&[("net/sockstat", "sockets: used 1\nRAW: inuse 1\n")]);
        let mut out = Vec::new();
        sockstat(v4.path(), 4096, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 2);
        for bad in ["TCP: inuse\n", "TCP: inuse 1 tw\n", "TCP: inuse x\n"] {
            let d = tree(&[("net/sockstat", bad)]);
            assert!(
                sockstat(d.path(), 4096, &mut Vec::new()).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn netstat_merges_the_three_files_and_keeps_the_default_fields() {
        let d = tree(&[
            (
                "net/netstat",
                "TcpExt: SyncookiesSent ListenDrops TCPTimeouts PruneCalled\nTcpExt: 0 22 27 5\n\
                 IpExt: InOctets OutOctets InMcastPkts\nIpExt: 66283388078 64874294099 3\n",
            ),
            (
                "net/snmp",
                "Ip: Forwarding DefaultTTL InReceives\nIp: 2 64 57624759\n\
                 Tcp: RtoAlgorithm ActiveOpens InErrs CurrEstab\nTcp: 1 76982 0 2\n\
                 Udp: InDatagrams NoPorts InErrors IgnoredMulti\nUdp: 55363795 0 470733 9\n",
            ),
            (
                "net/snmp6",
                "Ip6InReceives                   \t14909\nIp6InOctets \t1369384\n\
                 Udp6InErrors 0\nIcmp6OutMsgs 232\nnosix 1\n\n",
            ),
        ]);
        let mut out = Vec::new();
        netstat(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        let mut got = lines(&out);
        got.sort();
        assert_eq!(
            got,
            [
                "node_netstat_Icmp6_OutMsgs{} untyped 232",
                "node_netstat_Ip6_InOctets{} untyped 1369384",
                "node_netstat_IpExt_InOctets{} untyped 66283388078",
                "node_netstat_IpExt_OutOctets{} untyped 64874294099",
                "node_netstat_Ip_Forwarding{} untyped 2",
                "node_netstat_TcpExt_ListenDrops{} untyped 22",
                "node_netstat_TcpExt_SyncookiesSent{} untyped 0",
                "node_netstat_TcpExt_TCPTimeouts{} untyped 27",
                "node_netstat_Tcp_ActiveOpens{} untyped 76982",
                "node_netstat_Tcp_CurrEstab{} untyped 2",
                "node_netstat_Tcp_InErrs{} untyped 0",
                "node_netstat_Udp6_InErrors{} untyped 0",
                "node_netstat_Udp_InDatagrams{} untyped 55363795",
                "node_netstat_Udp_InErrors{} untyped 470733",
                "node_netstat_Udp_NoPorts{} untyped 0",
            ]
        );
        assert_eq!(
            help_of(&out, "node_netstat_Ip6_InOctets"),
            Some("Statistic Ip6InOctets.")
        );
        // No snmp6 (IPv6 disabled): skipped; no snmp: a failure.
        let v4 = tree(&[
            ("net/netstat", "TcpExt: ListenDrops\nTcpExt: 1\n"),
            ("net/snmp", "Ip: Forwarding\nIp: 1\n"),
        ]);
        let mut out = Vec::new();
        netstat(v4.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 2);
        let no_snmp = tree(&[("net/netstat", "TcpExt: ListenDrops\nTcpExt: 1\n")]);
        assert!(netstat(no_snmp.path(), &mut Vec::new()).is_err());
        let mismatch = tree(&[
            ("net/netstat", "TcpExt: ListenDrops TW\nTcpExt: 1\n"),
            ("net/snmp", "Ip: Forwarding\nIp: 1\n"),
        ]);
        assert!(netstat(mismatch.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn pressure_divides_microseconds_like_node_exporter() {
        let d = tree(&[
            (
                "pressure/cpu",
                "some avg10=0.00 avg60=1.12 avg300=15.90 total=9473148091\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            ),
            (
                "pressure/io",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=466795267\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=228923153\n",
            ),
            (
                "pressure/memory",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=33638401\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=16524377\n",
            ),
        ]);
        let mut out = Vec::new();
        pressure(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_pressure_cpu_waiting_seconds_total{} counter 9473.148091",
                "node_pressure_io_waiting_seconds_total{} counter 466.79526699999997",
                "node_pressure_io_stalled_seconds_total{} counter 228.92315299999999",
                "node_pressure_memory_waiting_seconds_total{} counter 33.638400999999995",
                "node_pressure_memory_stalled_seconds_total{} counter 16.524377",
            ]
        );
        // No PSI: a failure.
        assert!(pressure(tree(&[]).path(), &mut Vec::new()).is_err());
        let bad = tree(&[("pressure/cpu", "some total=1\n")]);
        assert!(pressure(bad.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn os_release_labels_and_version() {
        let d = tree(&[(
            "etc/os-release",
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n\
             VERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n\
             # a comment\nHOME_URL=\"https://www.debian.org/\"\n",
        )]);
        let mut out = Vec::new();
        os(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_os_info{build_id=\"\",id=\"debian\",id_like=\"\",image_id=\"\",\
                 image_version=\"\",name=\"Debian GNU/Linux\",pretty_name=\"Debian GNU/Linux 12 \
                 (bookworm)\",variant=\"\",variant_id=\"\",version=\"12 (bookworm)\",\
                 version_codename=\"bookworm\",version_id=\"12\"} gauge 1",
                "node_os_version{id=\"debian\",id_like=\"\",name=\"Debian GNU/Linux\"} gauge 12",
            ]
        );
        // The /usr/lib fallback; no numeric VERSION_ID: no node_os_version.
        let usr = tree(&[(
            "usr/lib/os-release",
            "NAME='Arch Linux'\nID=arch\nVERSION_ID=rolling\nBUILD_ID=\"a \\\"b\\\"\"\n",
        )]);
        let mut out = Vec::new();
        os(usr.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 1);
        let label = |n: &str| {
            out[0]
                .labels
                .iter()
                .find(|l| l.name == n)
                .map(|l| l.value.clone())
        };
        assert_eq!(label("name").as_deref(), Some("Arch Linux"));
        assert_eq!(label("build_id").as_deref(), Some("a \"b\""));
        assert!(os(tree(&[]).path(), &mut Vec::new()).is_err());
        assert_eq!(os_version("22.04"), 22.04);
        assert_eq!(os_version("8.6.2"), 8.6);
        assert_eq!(os_version("3."), 3.0);
        assert_eq!(os_version("rolling"), 0.0);
        assert_eq!(os_version(""), 0.0);
    }

    #[test]
    fn conntrack_sums_the_per_cpu_table() {
        let header = "entries  clashres found new invalid ignore delete chainlength insert \
                      insert_failed drop early_drop icmp_error  expect_new expect_create \
                      expect_delete search_restart\n";
        let row1 = "00000005  00000000 00000001 00000000 00000002 00000003 00000000 00000000 \
                    00000004 00000005 00000006 00000007 00000000  00000000 00000000 00000000 \
                    00000008\n";
        let row2 = "00000005  00000000 00000010 00000000 00000020 00000030 00000000 00000000 \
                    00000040 00000050 00000060 00000070 00000000  00000000 00000000 00000000 \
                    000000ff\n";
        let d = tree(&[
            ("sys/net/netfilter/nf_conntrack_count", "7\n"),
            ("sys/net/netfilter/nf_conntrack_max", "262144\n"),
            ("net/stat/nf_conntrack", &format!("{header}{row1}{row2}")),
        ]);
        let mut out = Vec::new();
        conntrack(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_nf_conntrack_entries{} gauge 7",
                "node_nf_conntrack_entries_limit{} gauge 262144",
                "node_nf_conntrack_stat_found{} gauge 17",
                "node_nf_conntrack_stat_invalid{} gauge 34",
                "node_nf_conntrack_stat_ignore{} gauge 51",
                "node_nf_conntrack_stat_insert{} gauge 68",
                "node_nf_conntrack_stat_insert_failed{} gauge 85",
                "node_nf_conntrack_stat_drop{} gauge 102",
                "node_nf_conntrack_stat_early_drop{} gauge 119",
                "node_nf_conntrack_stat_search_restart{} gauge 263",
            ]
        );
        // Module not loaded.
        assert!(matches!(
            conntrack(tree(&[]).path(), &mut Vec::new()),
            Err(NodeError::Read { .. })
        ));
        let short = tree(&[
            ("sys/net/netfilter/nf_conntrack_count", "7\n"),
            ("sys/net/netfilter/nf_conntrack_max", "9\n"),
            (
                "net/stat/nf_conntrack",
                &format!("{header}00000001 00000002\n"),
            ),
        ]);
        assert!(conntrack(short.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn softnet_rows_are_cpus_in_hex() {
        let d = tree(&[(
            "net/softnet_stat",
            "01b3d04e 00000001 00000032 00000000 00000000 00000000 00000000 00000000 00000000 \
             00000000 00000000 00000000 00000000 00000000 00000000\n\
             01bbbd49 00000000 00000034 00000000 00000000 00000000 00000000 00000000 00000000\n",
        )]);
        let mut out = Vec::new();
        softnet(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_softnet_processed_total{cpu=\"0\"} counter 28561486",
                "node_softnet_dropped_total{cpu=\"0\"} counter 1",
                "node_softnet_times_squeezed_total{cpu=\"0\"} counter 50",
                "node_softnet_processed_total{cpu=\"1\"} counter 29080905",
                "node_softnet_dropped_total{cpu=\"1\"} counter 0",
                "node_softnet_times_squeezed_total{cpu=\"1\"} counter 52",
            ]
        );
        let short = tree(&[("net/softnet_stat", "00000001 00000002\n")]);
        assert!(softnet(short.path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn schedstat_reads_the_cpu_lines() {
        let d = tree(&[(
            "schedstat",
            "version 15\ntimestamp 4297299139\n\
             cpu0 0 0 0 0 0 0 2000000000 1500000000 42\n\
             domain0 00000000,00000003 212 212 0 0 0 0 0 212 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
             cpu1 0 0 0 0 0 0 7 8 9\n",
        )]);
        let mut out = Vec::new();
        schedstat(d.path(), &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            lines(&out),
            [
                "node_schedstat_running_seconds_total{cpu=\"0\"} counter 2",
                "node_schedstat_waiting_seconds_total{cpu=\"0\"} counter 1.5",
                "node_schedstat_timeslices_total{cpu=\"0\"} counter 42",
                "node_schedstat_running_seconds_total{cpu=\"1\"} counter 0.000000007",
                "node_schedstat_waiting_seconds_total{cpu=\"1\"} counter 0.000000008",
                "node_schedstat_timeslices_total{cpu=\"1\"} counter 9",
            ]
        );
        assert!(schedstat(tree(&[]).path(), &mut Vec::new()).is_err());
    }

    #[test]
    fn the_default_field_filters() {
        for (name, selected) in [
            ("oom_kill", true),
            ("pgpgin", true),
            ("pswpout", true),
            ("pgmajfault", true),
            ("pgfault", true),
            ("thp_fault_alloc", false),
            ("pgfree", false),
            ("nr_free_pages", false),
        ] {
            assert_eq!(vmstat_field_selected(name), selected, "{name}");
        }
        for (key, selected) in [
            ("Ip_Forwarding", true),
            ("Ip_DefaultTTL", false),
            ("TcpExt_ListenOverflows", true),
            ("TcpExt_TCPTimeouts", true),
            ("TcpExt_PruneCalled", false),
            ("UdpLite_InErrors", true),
            ("Icmp6_InMsgs", true),
            ("Udp6_IgnoredMulti", false),
            ("Tcp_CurrEstab", true),
            ("Tcp_CurrEstabX", false),
        ] {
            assert_eq!(netstat_field_selected(key), selected, "{key}");
        }
    }
}
