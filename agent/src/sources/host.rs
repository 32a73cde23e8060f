//! Host metrics from `/proc` and `/sys`, named, typed and labelled like Prometheus
//! node_exporter (DESIGN.md §7), so existing Node Exporter dashboards work on uctel data.
//!
//! [`HostMetrics::collect`] runs the sub-collectors of [`crate::sources::node`]
//! ([`HostCollector`], one file each; that module lists every collector's sources and
//! series). Collectors listed in [`HostMetricsConfig::disabled`] do not run and emit no series
//! at all, `node_scrape_collector_*` included; `ethtool` runs only when
//! [`HostMetricsConfig::ethtool`] is set.
//!
//! Each run also emits node_exporter's own `node_scrape_collector_success{collector}` and
//! `node_scrape_collector_duration_seconds{collector}` gauges.
//!
//! A sub-collector that fails is reported in [`HostCollection::errors`], counted in
//! [`HostMetrics::failures`], its partial output is discarded, and the others still run.
//! `infiniband` can also succeed in part: files it had to skip are listed in
//! [`HostCollection::infiniband_skipped`], its other series are kept, and its
//! `node_scrape_collector_success` is 0 for that collection.
//!
//! Known differences from node_exporter: no CPU "jump back" smoothing on hotplug; statvfs(2) is
//! called inline, so a hung network filesystem blocks the collection (node_exporter marks such
//! mounts stale after a timeout) — exclude such mounts by fs type if that matters.

use std::time::{Duration, Instant};

use uctel_protocol::payload::Metric;

use super::metric::gauge;
use super::node::ethtool::{EthtoolSection, EthtoolSkip};
use super::node::{Outcome, ProcStat, Run};
use super::rdma::{PortEvent, RdmaCounters, SkippedFile};

pub use super::node::{HostCollector, HostError, HostPaths};

/// Configuration of [`HostMetrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostMetricsConfig {
    /// Pseudo filesystem roots.
    pub paths: HostPaths,
    /// Kernel clock ticks per second (`USER_HZ`) used to turn `/proc/stat` ticks into seconds;
    /// `None` asks the system (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
    pub ticks_per_second: Option<u64>,
    /// Sub-collectors that do not run.
    pub disabled: Vec<HostCollector>,
    /// The `ethtool` sub-collector's filters; `None` (the default): it does not run.
    pub ethtool: Option<EthtoolSection>,
}

/// A failed sub-collector and why.
#[derive(Debug, thiserror::Error)]
#[error("host collector {collector} failed: {error}")]
pub struct CollectorError {
    /// The sub-collector that failed.
    pub collector: HostCollector,
    /// Why.
    #[source]
    pub error: HostError,
}

/// The result of one [`HostMetrics::collect`]: the samples of every sub-collector that
/// succeeded, and one error per sub-collector that failed.
#[derive(Debug, Default)]
pub struct HostCollection {
    /// Samples of the sub-collectors that succeeded, plus the per-collector
    /// `node_scrape_collector_*` series.
    pub metrics: Vec<Metric>,
    /// One entry per sub-collector that failed.
    pub errors: Vec<CollectorError>,
    /// RDMA files the `infiniband` sub-collector skipped ([`RdmaCounters::collect_into`]);
    /// when there are any, its `node_scrape_collector_success` is 0.
    pub infiniband_skipped: Vec<SkippedFile>,
    /// What the `ethtool` sub-collector skipped (interfaces whose requests failed other than
    /// with `EOPNOTSUPP`, clashing statistic names); its success stays 1, as node_exporter's.
    pub ethtool_skipped: Vec<EthtoolSkip>,
    /// RDMA port state and GID changes since the previous collection
    /// ([`super::rdma::RdmaScan::events`]).
    pub infiniband_events: Vec<PortEvent>,
}

/// Collects host metrics; see the module documentation for the series produced.
#[derive(Debug)]
pub struct HostMetrics {
    paths: HostPaths,
    ticks_per_second: u64,
    disabled: Vec<HostCollector>,
    ethtool: Option<EthtoolSection>,
    rdma: RdmaCounters,
    failures: [u64; HostCollector::ALL.len()],
    /// Samples of the previous collection: the next one reserves that many up front, so a big
    /// host's sample vector is allocated once rather than grown (and copied) by doubling.
    last_len: usize,
}

impl HostMetrics {
    /// A collector reading the given roots. `ticks_per_second` of 0 is treated as the system
    /// value.
    pub fn new(config: HostMetricsConfig) -> Self {
        let ticks_per_second = match config.ticks_per_second {
            Some(t) if t > 0 => t,
            _ => procfs::ticks_per_second().max(1),
        };
        let rdma = RdmaCounters::new(&config.paths.sys);
        Self {
            paths: config.paths,
            ticks_per_second,
            disabled: config.disabled,
            ethtool: config.ethtool,
            rdma,
            failures: [0; HostCollector::ALL.len()],
            last_len: 0,
        }
    }

    /// Runs every sub-collector once. Never stops at a failing sub-collector: its error is in
    /// [`HostCollection::errors`], its `node_scrape_collector_success` sample is 0, and
    /// [`HostMetrics::failures`] counts it. `infiniband` files skipped are in
    /// [`HostCollection::infiniband_skipped`] (success 0, the other RDMA series kept, not
    /// counted in `failures`).
    pub fn collect(&mut self) -> HostCollection {
        let mut out = HostCollection {
            metrics: Vec::with_capacity(self.last_len),
            errors: Vec::new(),
            infiniband_skipped: Vec::new(),
            ethtool_skipped: Vec::new(),
            infiniband_events: Vec::new(),
        };
        let proc_stat = ProcStat::read(&self.paths.proc);
        for collector in HostCollector::ALL {
            let off = collector == HostCollector::Ethtool && self.ethtool.is_none();
            if off || self.disabled.contains(&collector) {
                continue;
            }
            let mark = out.metrics.len();
            let started = Instant::now();
            let result = collector.collect(&mut Run {
                paths: &self.paths,
                ticks_per_second: self.ticks_per_second,
                proc_stat: &proc_stat,
                ethtool: self.ethtool.as_ref(),
                rdma: &mut self.rdma,
                metrics: &mut out.metrics,
                infiniband_skipped: &mut out.infiniband_skipped,
                infiniband_events: &mut out.infiniband_events,
                ethtool_skipped: &mut out.ethtool_skipped,
            });
            let elapsed = started.elapsed();
            let ok = match result {
                Ok(outcome) => outcome == Outcome::Complete,
                Err(error) => {
                    out.metrics.truncate(mark);
                    if let Some(n) = self.failures.get_mut(collector.index()) {
                        *n += 1;
                    }
                    out.errors.push(CollectorError { collector, error });
                    false
                }
            };
            scrape_samples(collector, ok, elapsed, &mut out.metrics);
        }
        self.last_len = out.metrics.len();
        out
    }

    /// How many times `collector` has failed since this value was created.
    pub fn failures(&self, collector: HostCollector) -> u64 {
        self.failures.get(collector.index()).copied().unwrap_or(0)
    }

    /// The ticks-per-second value used to convert `/proc/stat`.
    pub fn ticks_per_second(&self) -> u64 {
        self.ticks_per_second
    }
}

impl Default for HostMetrics {
    fn default() -> Self {
        Self::new(HostMetricsConfig::default())
    }
}

fn scrape_samples(collector: HostCollector, ok: bool, elapsed: Duration, out: &mut Vec<Metric>) {
    let labels = [("collector", collector.name())];
    out.push(gauge(
        "node_scrape_collector_duration_seconds",
        "node_exporter: Duration of a collector scrape.",
        &labels,
        elapsed.as_secs_f64(),
    ));
    out.push(gauge(
        "node_scrape_collector_success",
        "node_exporter: Whether a collector succeeded.",
        &labels,
        if ok { 1.0 } else { 0.0 },
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::node::NodeError;
    use crate::sources::rdma::SkipReason;

    fn scrape_success(m: &[Metric], collector: &str) -> Option<f64> {
        m.iter()
            .find(|s| {
                s.name == "node_scrape_collector_success"
                    && s.labels
                        .iter()
                        .any(|l| l.name == "collector" && l.value == collector)
            })
            .map(|s| s.value)
    }

    #[test]
    fn a_missing_file_fails_only_its_collector_and_disabled_collectors_do_not_run() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(proc.join("sys/fs")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(proc.join("sys/fs/file-nr"), "352\t0\t2466165\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let config = |disabled: Vec<HostCollector>| HostMetricsConfig {
            paths: HostPaths {
                proc: proc.clone(),
                sys: dir.path().join("sys"),
                rootfs: dir.path().to_path_buf(),
            },
            ticks_per_second: Some(100),
            disabled,
            ethtool: None,
        };
        let mut host = HostMetrics::new(config(Vec::new()));
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "filefd"), Some(1.0));
        // `ethtool` is off without its section, as node_exporter's is by default.
        assert_eq!(scrape_success(&c.metrics, "ethtool"), None);
        let mut with_ethtool = config(Vec::new());
        with_ethtool.ethtool = Some(Default::default());
        let c2 = HostMetrics::new(with_ethtool).collect();
        // On, but the tree has no `sys/class/net`: that collector fails.
        assert_eq!(scrape_success(&c2.metrics, "ethtool"), Some(0.0));
        assert!(c2
            .errors
            .iter()
            .any(|e| e.collector == HostCollector::Ethtool));
        assert_eq!(scrape_success(&c.metrics, "uname"), Some(1.0));
        for missing in [
            "conntrack",
            "pressure",
            "schedstat",
            "vmstat",
            "os",
            "softnet",
        ] {
            assert_eq!(scrape_success(&c.metrics, missing), Some(0.0), "{missing}");
        }
        assert!(c.metrics.iter().any(|m| m.name == "node_filefd_allocated"));
        assert!(c
            .metrics
            .iter()
            .all(|m| !m.name.starts_with("node_nf_conntrack")));
        assert!(c
            .errors
            .iter()
            .any(|e| e.collector == HostCollector::Conntrack
                && matches!(e.error, HostError::Node(NodeError::Read { .. }))));
        assert!(c
            .errors
            .iter()
            .all(|e| e.collector != HostCollector::Filefd));
        // sockstat without its files is empty, not a failure (node_exporter skips them).
        assert_eq!(scrape_success(&c.metrics, "sockstat"), Some(1.0));
        host.collect();
        assert_eq!(host.failures(HostCollector::Conntrack), 2);
        assert_eq!(host.failures(HostCollector::Filefd), 0);

        let mut host = HostMetrics::new(config(vec![
            HostCollector::Filefd,
            HostCollector::Conntrack,
        ]));
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "filefd"), None);
        assert_eq!(scrape_success(&c.metrics, "conntrack"), None);
        assert!(c.metrics.iter().all(|m| !m.name.starts_with("node_filefd")));
        assert!(c
            .errors
            .iter()
            .all(|e| e.collector != HostCollector::Conntrack));
        assert_eq!(scrape_success(&c.metrics, "uname"), Some(1.0));
    }

    #[test]
    fn infiniband_scrape_fails_when_a_file_is_skipped_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let counters = dir.path().join("class/infiniband/rxe0/ports/1/counters");
        std::fs::create_dir_all(&counters).unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, text: &str| {
            std::fs::write(counters.join(name), text).unwrap_or_else(|e| panic!("{e}"));
        };
        write("port_rcv_data", "10\n");
        let mut host = HostMetrics::new(HostMetricsConfig {
            paths: HostPaths {
                proc: dir.path().join("no-proc"),
                sys: dir.path().to_path_buf(),
                rootfs: dir.path().to_path_buf(),
            },
            ticks_per_second: Some(100),
            disabled: Vec::new(),
            ethtool: None,
        });
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "infiniband"), Some(1.0));
        assert!(c.infiniband_skipped.is_empty());

        write("symbol_error", "N/A (no PMA)\n");
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "infiniband"), Some(0.0));
        let skipped: Vec<_> = c
            .infiniband_skipped
            .iter()
            .map(|f| (f.path.clone(), f.reason, f.first))
            .collect();
        assert_eq!(
            skipped,
            vec![(
                counters.join("symbol_error"),
                SkipReason::NotAvailable,
                true
            )]
        );
        assert!(
            c.metrics
                .iter()
                .any(|m| m.name == "node_infiniband_port_data_received_bytes_total"),
            "the other RDMA series are kept"
        );
        assert!(c
            .errors
            .iter()
            .all(|e| e.collector != HostCollector::Infiniband));
        assert_eq!(host.failures(HostCollector::Infiniband), 0);
        // Still failing at the next collection, no longer new.
        let c = host.collect();
        assert_eq!(scrape_success(&c.metrics, "infiniband"), Some(0.0));
        assert_eq!(c.infiniband_skipped.first().map(|f| f.first), Some(false));
    }
}
