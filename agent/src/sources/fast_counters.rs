//! High-frequency counters (`sources.fast_counters`): a short list of counters — sysfs
//! files such as an RDMA port's `hw_counters/out_of_buffer` or a NIC's
//! `statistics/rx_packets`, or `ethtool -S` statistics by name — sampled every
//! `interval_milliseconds` (default 10, down to 1), many samples of one counter packed into
//! one [`SampleSeries`] record, shipped on their own stream (`fast_counters`, `drop` when out
//! of credit: fresh or worthless).
//!
//! This module is the sans-IO part and the readers: the configuration, how a counter's
//! series name is derived, the per-counter
//! [`SeriesBuffer`] and the [`Reader`]s. The sampling thread is
//! [`crate::runners::fast_counters_thread`].
//!
//! **Names.** A counter without `name` is named like the collector that reads the same
//! value at the normal interval, so dashboards can put both side by side:
//!
//! | source | series | labels |
//! |---|---|---|
//! | `<sys>/class/infiniband/<dev>/ports/<p>/counters/<file>` | as [`super::rdma::PORT_COUNTERS`] (`port_xmit_data` ×4 = bytes) | `device`, `port` |
//! | `<sys>/class/infiniband/<dev>/ports/<p>/hw_counters/<file>` | `node_infiniband_<file>` | `device`, `port` |
//! | `<sys>/class/net/<dev>/statistics/<file>` | `node_network_<receive\|transmit>_<x>_total`, as node_exporter's netdev collector names `/proc/net/dev` columns | `device` |
//! | `ethtool: {device, stat}` | as the `ethtool` host collector names it ([`super::node::ethtool::series_identity`]: `rx_queue_0_packets` → `node_ethtool_received_queue_0_packets`) | `device` |
//!
//! Any other file needs a `name`. A counter that a host collector also reads (the same name
//! and labels) is one series at the collector (`/metrics` serves the latest of both), but
//! reaches remote-write from both streams: the host collection's sample can then be older
//! than a fast sample already sent, which Prometheus refuses as out of order (counted as
//! failed by the remote-write output). With remote-write into Prometheus, give such a
//! counter a `name` of its own. A file is opened once and re-read with `pread(2)` at
//! offset 0 at every sample (sysfs regenerates an attribute's text on every read from
//! offset 0); it must hold one unsigned integer. A file removed while open is a read error
//! (and is opened again at the next sample), not its last value.
//!
//! **Timing.** Sampling instants are whole multiples of `interval_milliseconds` since the
//! Unix epoch plus `offset_milliseconds` on the wall clock ([`crate::pacing::grid`], OVIS
//! LDMS's `interval` + `offset`), so agents on different hosts sample the same instants. A
//! sample's time is the monotonic instant just before its read, converted to Unix time
//! through an anchor taken at the start of its round (so the times follow the wall clock
//! without drift, and a record's times never go back: a wall clock stepped back holds them
//! at the previous one). Lateness (`sample time − scheduled instant`) is observed in
//! `uctel_agent_fast_sample_lateness_seconds`. A round that finds its next instant already
//! past skips the instants missed (counted in `uctel_agent_fast_missed_rounds_total`) rather
//! than bursting to catch up.
//!
//! **Accounting.** A [`SampleSeries`] counts one record per sample in every accounting
//! (`uctel_protocol::samples`), so `uctel_agent_fast_samples_total` (samples taken)
//! = the collector's `records_received_total{stream="fast_counters"}` + its
//! `records_lost_total` + the agent's `records_dropped_total{stream="fast_counters"}` over
//! all reasons, exactly, once the epoch has ended with its `Goodbye`. A failed read takes no
//! sample and is counted in `uctel_agent_source_errors_total{source="fast_counters"}`.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uctel_protocol::payload::{is_valid_label_name, is_valid_metric_name, Label, MetricType};
use uctel_protocol::samples::SampleSeries;

use super::metric::sanitize_name_part;
use super::rdma::PORT_COUNTERS;

/// The shortest sampling interval, milliseconds.
pub const MIN_INTERVAL_MS: u64 = 1;
/// The most counters one agent samples.
pub const MAX_COUNTERS: usize = 256;

/// `sources.fast_counters`. Off when absent.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FastCountersSection {
    /// Milliseconds between two samples of every counter: 1 to 60000. Default 10.
    #[serde(default = "default_interval_ms")]
    pub interval_milliseconds: u64,
    /// Offset of the sampling instants within the interval, milliseconds: samples are
    /// taken at whole multiples of `interval_milliseconds` since the Unix epoch plus this
    /// (OVIS LDMS's `interval` + `offset`), so every agent samples the same instants. 0 to
    /// below the interval. Default 0.
    #[serde(default)]
    pub offset_milliseconds: u64,
    /// Samples of one counter packed into one record: a record leaves once it holds this
    /// many (at the default 10 ms and 20 samples: every 200 ms). At shutdown what is held is
    /// offered too (counted `shutdown` if the last frames have already left). 1 to 4096.
    /// Default 20.
    #[serde(default = "default_samples_per_record")]
    pub samples_per_record: usize,
    /// The counters, at most 256. Each is a `path` or an `ethtool` statistic, with
    /// optional `name`, `labels` and `type`.
    pub counters: Vec<FastCounter>,
}

fn default_interval_ms() -> u64 {
    10
}
fn default_samples_per_record() -> usize {
    20
}

/// One entry of `sources.fast_counters.counters`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FastCounter {
    /// A file holding one unsigned integer (sysfs, procfs), e.g.
    /// `/sys/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer`.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// An `ethtool -S` statistic of an interface: `{ device: eth0, stat: rx_pause_ctrl_phy }`.
    #[serde(default)]
    pub ethtool: Option<EthtoolStat>,
    /// Series name; derived from `path` or `ethtool` when absent (see the module docs).
    #[serde(default)]
    pub name: Option<String>,
    /// Labels added to the derived ones (same name: this value wins).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `counter`, `gauge` or `untyped`. Default `counter`, and `untyped` for an `ethtool`
    /// statistic (the type the `ethtool` host collector gives it, as node_exporter does, so
    /// the two can serve the same series).
    #[serde(default, rename = "type")]
    pub kind: Option<FastKind>,
}

/// `ethtool: { device, stat }`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EthtoolStat {
    /// Interface name (`eth0`, `enp1s0f0np0`).
    pub device: String,
    /// Statistic name exactly as `ethtool -S` prints it.
    pub stat: String,
}

/// The Prometheus type of a fast counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FastKind {
    /// Cumulative.
    Counter,
    /// A level.
    Gauge,
    /// Of unknown kind (ethtool statistics, as node_exporter types them); the collector
    /// treats it as a counter for its rate.
    Untyped,
}

/// Where a counter's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A file re-read at offset 0.
    File(PathBuf),
    /// An `ethtool -S` statistic.
    Ethtool(EthtoolStat),
}

/// A configured counter, resolved: its series identity, where it is read and the factor
/// its raw value is multiplied by.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterSpec {
    /// Series name.
    pub name: String,
    /// HELP text.
    pub help: String,
    /// Counter or gauge.
    pub kind: FastKind,
    /// Labels, sorted by name.
    pub labels: Vec<Label>,
    /// Where the value is read.
    pub origin: Origin,
    /// Raw value × `scale` = the exported value (4 for IBTA data counters in 32-bit words).
    pub scale: u64,
}

impl FastCountersSection {
    /// What `--check-config` says about the section (key suffix, problem).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !(MIN_INTERVAL_MS..=60_000).contains(&self.interval_milliseconds) {
            out.push((
                "interval_milliseconds".to_owned(),
                format!("must be 1 to 60000, got {}", self.interval_milliseconds),
            ));
        }
        if self.offset_milliseconds >= self.interval_milliseconds.max(MIN_INTERVAL_MS) {
            out.push((
                "offset_milliseconds".to_owned(),
                format!(
                    "must be less than interval_milliseconds ({}), got {}",
                    self.interval_milliseconds, self.offset_milliseconds
                ),
            ));
        }
        if !(1..=4096).contains(&self.samples_per_record) {
            out.push((
                "samples_per_record".to_owned(),
                format!("must be 1 to 4096, got {}", self.samples_per_record),
            ));
        }
        if self.counters.is_empty() || self.counters.len() > MAX_COUNTERS {
            out.push((
                "counters".to_owned(),
                format!(
                    "must list 1 to {MAX_COUNTERS} counters, got {}",
                    self.counters.len()
                ),
            ));
        }
        for (i, c) in self.counters.iter().enumerate() {
            if let Err(e) = c.resolve() {
                out.push((format!("counters[{i}]"), e));
            }
        }
        out
    }

    /// Every counter resolved (see [`FastCounter::resolve`]); the first problem otherwise.
    ///
    /// # Errors
    /// `counters[i]: <problem>`.
    pub fn resolve(&self) -> Result<Vec<CounterSpec>, String> {
        self.counters
            .iter()
            .enumerate()
            .map(|(i, c)| c.resolve().map_err(|e| format!("counters[{i}]: {e}")))
            .collect()
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_milliseconds.max(MIN_INTERVAL_MS))
    }

    /// The offset of the sampling instants within the interval.
    pub fn offset(&self) -> Duration {
        Duration::from_millis(self.offset_milliseconds)
    }
}

impl FastCounter {
    /// The counter's series identity and origin.
    ///
    /// # Errors
    /// Neither or both of `path` and `ethtool`; no `name` where none can be derived; a name
    /// or label name outside the Prometheus grammar.
    pub fn resolve(&self) -> Result<CounterSpec, String> {
        let (origin, derived) = match (&self.path, &self.ethtool) {
            (Some(p), None) => (Origin::File(p.clone()), derive_from_path(p)),
            (None, Some(e)) => (Origin::Ethtool(e.clone()), Some(derive_from_ethtool(e))),
            _ => return Err("needs exactly one of `path` and `ethtool`".to_owned()),
        };
        let (name, help, mut labels, scale) = match (&self.name, derived) {
            (Some(n), d) => {
                let (_, help, labels, _) = d.unwrap_or_default();
                (n.clone(), help, labels, 1)
            }
            (None, Some(d)) => d,
            (None, None) => {
                return Err(
                    "needs a `name`: none can be derived from this path (see the docs)".to_owned(),
                )
            }
        };
        if !is_valid_metric_name(&name) {
            return Err(format!(
                "name {name:?} does not match [a-zA-Z_:][a-zA-Z0-9_:]*"
            ));
        }
        for (k, v) in &self.labels {
            if !is_valid_label_name(k) {
                return Err(format!("label name {k:?} is not a valid label name"));
            }
            labels.insert(k.clone(), v.clone());
        }
        let help = if help.is_empty() {
            match &origin {
                Origin::File(p) => format!("Sampled from {}.", p.display()),
                Origin::Ethtool(e) => format!("Network interface {}", e.stat),
            }
        } else {
            help
        };
        Ok(CounterSpec {
            name,
            help,
            kind: self.kind.unwrap_or(match origin {
                Origin::File(_) => FastKind::Counter,
                Origin::Ethtool(_) => FastKind::Untyped,
            }),
            labels: labels
                .into_iter()
                .map(|(name, value)| Label { name, value })
                .collect(),
            origin,
            scale,
        })
    }
}

/// (name, help, labels, scale) derived from a source.
type Derived = (String, String, BTreeMap<String, String>, u64);

/// The names of `/proc/net/dev` columns that node_exporter's netdev collector gives the
/// sysfs `statistics/` files of the same counters (`rx_*` → `receive_*`).
const NET_STATISTICS: &[(&str, &str)] = &[
    ("rx_bytes", "receive_bytes"),
    ("rx_packets", "receive_packets"),
    ("rx_errors", "receive_errs"),
    ("rx_dropped", "receive_drop"),
    ("rx_fifo_errors", "receive_fifo"),
    ("rx_frame_errors", "receive_frame"),
    ("rx_compressed", "receive_compressed"),
    ("multicast", "receive_multicast"),
    ("rx_nohandler", "receive_nohandler"),
    ("tx_bytes", "transmit_bytes"),
    ("tx_packets", "transmit_packets"),
    ("tx_errors", "transmit_errs"),
    ("tx_dropped", "transmit_drop"),
    ("tx_fifo_errors", "transmit_fifo"),
    ("collisions", "transmit_colls"),
    ("tx_carrier_errors", "transmit_carrier"),
    ("tx_compressed", "transmit_compressed"),
];

/// The part of `path` after `class/`, as plain names.
fn class_parts(path: &Path) -> Option<Vec<String>> {
    let names: Vec<String> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str().map(str::to_owned),
            _ => None,
        })
        .collect();
    let at = names.iter().rposition(|n| n == "class")?;
    Some(names[at + 1..].to_vec())
}

fn derive_from_path(path: &Path) -> Option<Derived> {
    let parts = class_parts(path)?;
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    match parts.as_slice() {
        ["infiniband", dev, "ports", port, "counters", file] => {
            let (_, name, help, scale) = PORT_COUNTERS.iter().find(|c| c.0 == *file)?;
            Some((
                format!("node_infiniband_{name}"),
                (*help).to_owned(),
                labels(&[("device", dev), ("port", port)]),
                *scale,
            ))
        }
        ["infiniband", dev, "ports", port, "hw_counters", file] => Some((
            format!("node_infiniband_{}", sanitize_name_part(file)),
            format!("Driver counter {file} of the port (hw_counters)."),
            labels(&[("device", dev), ("port", port)]),
            1,
        )),
        ["net", dev, "statistics", file] => {
            let (_, column) = NET_STATISTICS.iter().find(|c| c.0 == *file)?;
            Some((
                format!("node_network_{column}_total"),
                format!("Network device statistic {column}."),
                labels(&[("device", dev)]),
                1,
            ))
        }
        _ => None,
    }
}

fn derive_from_ethtool(e: &EthtoolStat) -> Derived {
    let mut labels = BTreeMap::new();
    labels.insert("device".to_owned(), e.device.clone());
    let (name, help) = super::node::ethtool::series_identity(&e.stat);
    (name, help, labels, 1)
}

/// Samples of one counter not yet shipped.
#[derive(Debug, Clone, Default)]
pub struct SeriesBuffer {
    start_us: i64,
    offsets_us: Vec<u64>,
    values: Vec<f64>,
}

impl SeriesBuffer {
    /// Adds a sample taken at `time_us` (µs since the Unix epoch, non-decreasing).
    pub fn push(&mut self, time_us: i64, value: f64) {
        if self.values.is_empty() {
            self.start_us = time_us;
        }
        let offset = u64::try_from(time_us.saturating_sub(self.start_us)).unwrap_or(0);
        let offset = offset.max(self.offsets_us.last().copied().unwrap_or(0));
        self.offsets_us.push(offset);
        self.values.push(value);
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The samples held as a record of `spec`'s series; the buffer is left empty.
    pub fn take(&mut self, spec: &CounterSpec) -> Option<SampleSeries> {
        if self.values.is_empty() {
            return None;
        }
        Some(SampleSeries {
            name: spec.name.clone(),
            help: spec.help.clone(),
            r#type: match spec.kind {
                FastKind::Counter => MetricType::Counter as i32,
                FastKind::Gauge => MetricType::Gauge as i32,
                FastKind::Untyped => MetricType::Untyped as i32,
            },
            labels: spec.labels.clone(),
            start_us: self.start_us,
            offsets_us: std::mem::take(&mut self.offsets_us),
            values: std::mem::take(&mut self.values),
        })
    }
}

/// Why a read took no sample (`reason` of `uctel_agent_source_errors_total{source="fast_counters"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadError {
    /// The file or statistic could not be opened or read.
    Read,
    /// The text is not one unsigned integer.
    Parse,
}

impl ReadError {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadError::Read => "read_error",
            ReadError::Parse => "parse_error",
        }
    }
}

/// Reads one file-backed counter: opened once, re-read at offset 0.
#[derive(Debug)]
pub struct FileReader {
    path: PathBuf,
    /// The open file, and whether it is on sysfs or procfs.
    file: Option<(File, bool)>,
    buf: [u8; 64],
}

/// `SYSFS_MAGIC` of Linux `include/uapi/linux/magic.h`.
const SYSFS_MAGIC: u64 = 0x6265_6572;

/// Whether `file` is on sysfs or procfs, whose attributes fail their read once their object
/// is gone (a regular file keeps its contents after it is removed).
fn on_pseudo_fs(file: &File) -> bool {
    rustix::fs::fstatfs(file).is_ok_and(|s| {
        let kind = s.f_type as u64;
        kind == SYSFS_MAGIC || kind == rustix::fs::PROC_SUPER_MAGIC as u64
    })
}

impl FileReader {
    /// A reader of `path`; opened at the first read (and again after a failed one).
    pub fn new(path: PathBuf) -> FileReader {
        FileReader {
            path,
            file: None,
            buf: [0; 64],
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current value.
    ///
    /// # Errors
    /// [`ReadError::Read`] (open or read failed: the file is reopened next time),
    /// [`ReadError::Parse`] (not one unsigned integer).
    pub fn read(&mut self) -> Result<u64, ReadError> {
        if self.file.is_none() {
            let f = File::open(&self.path).map_err(|_| ReadError::Read)?;
            let pseudo = on_pseudo_fs(&f);
            self.file = Some((f, pseudo));
        }
        // A removed regular file (no link left) would keep answering its last contents: it
        // is gone, not a value. sysfs and procfs fail the read themselves, so they are not
        // checked (one syscall less per sample).
        let read = self.file.as_ref().and_then(|(f, pseudo)| {
            let gone = !pseudo && f.metadata().map_or(true, |m| m.nlink() == 0);
            (!gone).then(|| f.read_at(&mut self.buf, 0))
        });
        let n = match read {
            Some(Ok(n)) => n,
            _ => {
                self.file = None;
                return Err(ReadError::Read);
            }
        };
        parse_u64(&self.buf[..n]).ok_or(ReadError::Parse)
    }
}

/// Reads one `ethtool -S` statistic of one interface: the interface's statistics read
/// with one `ETHTOOL_GSTATS` per sample ([`crate::sources::sys::ethtool::StatsReader`], opened at
/// the first read and again after a failed one, so a driver whose set changed is re-read).
#[derive(Debug)]
pub struct EthtoolReader {
    stat: EthtoolStat,
    open: Option<(crate::sources::sys::ethtool::StatsReader, usize)>,
    values: Vec<u64>,
}

impl EthtoolReader {
    /// A reader of `stat`.
    pub fn new(stat: EthtoolStat) -> EthtoolReader {
        EthtoolReader {
            stat,
            open: None,
            values: Vec::new(),
        }
    }

    /// The current value.
    ///
    /// # Errors
    /// [`ReadError::Read`]: the interface or its statistics cannot be read, or it has no
    /// statistic of that name.
    pub fn read(&mut self) -> Result<u64, ReadError> {
        if self.open.is_none() {
            let reader = crate::sources::sys::ethtool::StatsReader::open(&self.stat.device)
                .map_err(|_| ReadError::Read)?;
            let index = reader
                .names()
                .iter()
                .position(|n| *n == self.stat.stat)
                .ok_or(ReadError::Read)?;
            self.open = Some((reader, index));
        }
        let read = match self.open.as_mut() {
            Some((reader, index)) => reader
                .read(&mut self.values)
                .ok()
                .and_then(|()| self.values.get(*index).copied()),
            None => None,
        };
        read.ok_or_else(|| {
            self.open = None;
            ReadError::Read
        })
    }
}

/// Reads one counter, whatever its [`Origin`].
#[derive(Debug)]
pub enum Reader {
    /// A file.
    File(FileReader),
    /// An ethtool statistic.
    Ethtool(EthtoolReader),
}

impl Reader {
    /// A reader of `origin`.
    pub fn new(origin: &Origin) -> Reader {
        match origin {
            Origin::File(p) => Reader::File(FileReader::new(p.clone())),
            Origin::Ethtool(e) => Reader::Ethtool(EthtoolReader::new(e.clone())),
        }
    }

    /// The current raw value.
    ///
    /// # Errors
    /// See [`FileReader::read`] and [`EthtoolReader::read`].
    pub fn read(&mut self) -> Result<u64, ReadError> {
        match self {
            Reader::File(f) => f.read(),
            Reader::Ethtool(e) => e.read(),
        }
    }
}

/// One unsigned decimal integer, surrounding whitespace allowed.
pub fn parse_u64(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// µs since the Unix epoch of monotonic `at`, through the anchor `(mono, unix_us)`.
pub fn unix_us(anchor: (Instant, i64), at: Instant) -> i64 {
    let since = at.saturating_duration_since(anchor.0).as_micros();
    anchor
        .1
        .saturating_add(i64::try_from(since).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(path: &str) -> FastCounter {
        FastCounter {
            path: Some(path.into()),
            ethtool: None,
            name: None,
            labels: BTreeMap::new(),
            kind: None,
        }
    }

    fn labels(s: &CounterSpec) -> Vec<(&str, &str)> {
        s.labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    #[test]
    fn names_follow_the_collectors_that_read_the_same_files() {
        let s = counter("/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data")
            .resolve()
            .unwrap();
        assert_eq!(s.name, "node_infiniband_port_data_transmitted_bytes_total");
        assert_eq!(s.scale, 4);
        assert_eq!(labels(&s), [("device", "mlx5_0"), ("port", "1")]);
        let s = counter("/host/sys/class/infiniband/mlx5_1/ports/2/hw_counters/out_of_buffer")
            .resolve()
            .unwrap();
        assert_eq!(s.name, "node_infiniband_out_of_buffer");
        assert_eq!(
            (s.scale, labels(&s)),
            (1, vec![("device", "mlx5_1"), ("port", "2")])
        );
        let s = counter("/sys/class/net/eth0/statistics/rx_packets")
            .resolve()
            .unwrap();
        assert_eq!(s.name, "node_network_receive_packets_total");
        assert_eq!(labels(&s), [("device", "eth0")]);
        let e = FastCounter {
            path: None,
            ethtool: Some(EthtoolStat {
                device: "eth0".into(),
                stat: "rx_queue_0_packets".into(),
            }),
            ..counter("/x")
        };
        let s = e.resolve().unwrap();
        assert_eq!(s.name, "node_ethtool_received_queue_0_packets");
        assert_eq!(
            s.kind,
            FastKind::Untyped,
            "as the ethtool collector types it"
        );
        assert_eq!(s.origin, Origin::Ethtool(e.ethtool.clone().unwrap()));
    }

    #[test]
    fn bad_counters_say_what_is_wrong() {
        let err = counter("/proc/loadavg").resolve().unwrap_err();
        assert!(err.contains("needs a `name`"), "{err}");
        let mut c = counter("/proc/x");
        c.name = Some("bad name".into());
        assert!(c.resolve().unwrap_err().contains("does not match"));
        c.name = Some("ok_total".into());
        c.labels.insert("__x".into(), "v".into());
        assert!(c.resolve().unwrap_err().contains("label name"));
        let both = FastCounter {
            ethtool: Some(EthtoolStat {
                device: "a".into(),
                stat: "b".into(),
            }),
            ..counter("/x")
        };
        assert!(both.resolve().unwrap_err().contains("exactly one"));
        let section = FastCountersSection {
            interval_milliseconds: 0,
            offset_milliseconds: 1,
            samples_per_record: 0,
            counters: vec![],
        };
        let keys: Vec<String> = section.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(
            keys,
            [
                "interval_milliseconds",
                "offset_milliseconds",
                "samples_per_record",
                "counters"
            ]
        );
    }

    #[test]
    fn a_given_name_keeps_the_derived_labels_and_adds_its_own() {
        let mut c = counter("/sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_pkts");
        c.name = Some("rxe_packets_total".into());
        c.labels.insert("port".into(), "p1".into());
        c.labels.insert("fabric".into(), "a".into());
        c.kind = Some(FastKind::Gauge);
        let s = c.resolve().unwrap();
        assert_eq!(s.name, "rxe_packets_total");
        assert_eq!(
            labels(&s),
            [("device", "rxe0"), ("fabric", "a"), ("port", "p1")]
        );
        assert_eq!(s.kind, FastKind::Gauge);
    }

    #[test]
    fn a_buffer_becomes_one_valid_record() {
        let spec = counter("/sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent")
            .resolve()
            .unwrap();
        let mut b = SeriesBuffer::default();
        assert!(b.take(&spec).is_none());
        for i in 0..20 {
            b.push(1_700_000_000_000_000 + i * 10_000, i as f64);
        }
        // A time that goes back is held at the previous offset, never negative.
        b.push(1_700_000_000_000_000, 20.0);
        let s = b.take(&spec).unwrap();
        assert!(b.is_empty());
        assert_eq!(s.values.len(), 21);
        assert_eq!(s.offsets_us[19], 190_000);
        assert_eq!(s.offsets_us[20], 190_000);
        uctel_protocol::samples::validate_sample_series(&s, &Default::default()).unwrap();
    }

    #[test]
    fn a_file_is_re_read_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c");
        std::fs::write(&p, "41\n").unwrap();
        let mut r = FileReader::new(p.clone());
        assert_eq!(r.read(), Ok(41));
        std::fs::write(&p, "1234567890123\n").unwrap();
        assert_eq!(r.read(), Ok(1_234_567_890_123));
        std::fs::write(&p, "N/A (no PMA)\n").unwrap();
        assert_eq!(r.read(), Err(ReadError::Parse));
        std::fs::write(&p, "5\n").unwrap();
        assert_eq!(r.read(), Ok(5));
        // Removed while open: an error, not its last value.
        std::fs::remove_file(&p).unwrap();
        assert_eq!(r.read(), Err(ReadError::Read));
        assert_eq!(r.read(), Err(ReadError::Read));
        let mut gone = FileReader::new(p);
        assert_eq!(gone.read(), Err(ReadError::Read));
        assert_eq!(parse_u64(b" 7 \n"), Some(7));
        // procfs and sysfs are recognised (no removal check per read), a temp file is not.
        assert!(on_pseudo_fs(&File::open("/proc/self/stat").unwrap()));
        assert!(on_pseudo_fs(
            &File::open("/sys/kernel/uevent_seqnum").unwrap()
        ));
        let tmp = dir.path().join("t");
        std::fs::write(&tmp, "1").unwrap();
        assert!(!on_pseudo_fs(&File::open(&tmp).unwrap()));
        assert_eq!(parse_u64(b"-1"), None);
    }

    #[test]
    fn sample_times_come_from_the_monotonic_clock() {
        let t0 = Instant::now();
        let anchor = (t0, 1_000_000);
        assert_eq!(unix_us(anchor, t0 + Duration::from_micros(1500)), 1_001_500);
        assert_eq!(unix_us(anchor, t0), 1_000_000);
    }
}
