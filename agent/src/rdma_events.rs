//! RDMA events as agent counters: port state and GID table changes seen by the host
//! collector's `infiniband` sub-collector ([`crate::sources::rdma`]), and the asynchronous
//! events (`ibv_get_async_event`) of the agent's own device, QP and CQs.
//!
//! | series | type | labels |
//! |---|---|---|
//! | `uctel_agent_rdma_port_state_changes_total` | counter | `device`, `port`, `to` ([`crate::sources::rdma::PortState::name`]) |
//! | `uctel_agent_rdma_gid_changes_total` | counter | `device`, `port` |
//! | `uctel_agent_rdma_async_events_total` | counter | `event` ([`AsyncEventKind`]) |
//!
//! Why `uctel_agent_*` and not `node_*`: the `node_*` series of the host collector are
//! node_exporter's (same names, labels and values, read from a kernel file at each
//! collection). These counters are not in any kernel file and node_exporter has no such series:
//! the agent derives them by comparing two collections (port events, so a change that is
//! undone within one `host_metrics` interval is not seen) or counts what its own transport
//! reported (async events). They start at zero when the agent starts, like every other agent
//! self-metric, and are shipped and served with them.
//!
//! A GID change counts one per entry added, removed or replaced. The first collection is the
//! baseline and counts nothing. Each kind of port event is logged once per port (at `info`;
//! later ones at `debug`, the counter has them all). `uctel_agent_rdma_async_events_total` has
//! every `event` at zero from the start; each kind is logged once at `warn` (later ones at
//! `debug`).
//!
//! Which async events end the session: `qp_fatal` (the QP is in ERROR and carries nothing
//! more), `cq_error` (a completion was lost, and the QP that produced it is in ERROR) and
//! `device_fatal` (every object on the device is unusable); the agent then says Goodbye and
//! reconnects with a new epoch and a new QP, the event's kind in the reason it logs
//! (DESIGN.md §2: a QP in ERROR is never repaired). `port_change` only counts and logs: a port
//! that went down and up again carries the same QP.

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use uctel_transport::api::{AsyncEvent, Device};

use crate::sources::rdma::{PortChange, PortEvent};

/// Most async events taken from the device per [`drain_async_events`] call, so that an event
/// storm cannot keep the send loop from running.
pub const MAX_EVENTS_PER_POLL: usize = 64;

/// The `event` label of `uctel_agent_rdma_async_events_total`. Closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    /// `IBV_EVENT_QP_FATAL` (and the QP request/access errors the verbs transport folds into
    /// it): the QP moved to ERROR.
    QpFatal,
    /// `IBV_EVENT_CQ_ERR`: a CQ overran.
    CqError,
    /// `IBV_EVENT_PORT_ACTIVE` / `IBV_EVENT_PORT_ERR`.
    PortChange,
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
}

impl AsyncEventKind {
    /// Every kind, for pre-registering zero-valued series.
    pub const ALL: [AsyncEventKind; 4] = [
        AsyncEventKind::QpFatal,
        AsyncEventKind::CqError,
        AsyncEventKind::PortChange,
        AsyncEventKind::DeviceFatal,
    ];

    /// The kind of `ev`. The agent creates no shared receive queue, so its device raises no
    /// SRQ event; one would be counted as `device_fatal` (an SRQ failing under the agent
    /// would mean its device state is not what the agent made it).
    pub fn of(ev: &AsyncEvent) -> Self {
        match ev {
            AsyncEvent::SrqLimitReached { .. } | AsyncEvent::SrqError { .. } => {
                AsyncEventKind::DeviceFatal
            }
            AsyncEvent::QpFatal { .. } => AsyncEventKind::QpFatal,
            AsyncEvent::CqError { .. } => AsyncEventKind::CqError,
            AsyncEvent::PortChange { .. } => AsyncEventKind::PortChange,
            AsyncEvent::DeviceFatal => AsyncEventKind::DeviceFatal,
        }
    }

    /// The label value: `qp_fatal`, `cq_error`, `port_change`, `device_fatal`.
    pub fn as_str(self) -> &'static str {
        match self {
            AsyncEventKind::QpFatal => "qp_fatal",
            AsyncEventKind::CqError => "cq_error",
            AsyncEventKind::PortChange => "port_change",
            AsyncEventKind::DeviceFatal => "device_fatal",
        }
    }

    /// Position in [`AsyncEventKind::ALL`].
    pub fn index(self) -> usize {
        match self {
            AsyncEventKind::QpFatal => 0,
            AsyncEventKind::CqError => 1,
            AsyncEventKind::PortChange => 2,
            AsyncEventKind::DeviceFatal => 3,
        }
    }

    /// Whether the session cannot go on after this event (see the module documentation).
    pub fn ends_session(self) -> bool {
        !matches!(self, AsyncEventKind::PortChange)
    }
}

/// The RDMA event counters; part of [`crate::selfmetrics::SelfMetrics`] (same registry).
#[derive(Debug)]
pub struct RdmaEventMetrics {
    port_state_changes: IntCounterVec,
    gid_changes: IntCounterVec,
    async_events: [IntCounter; AsyncEventKind::ALL.len()],
    async_logged: [AtomicBool; AsyncEventKind::ALL.len()],
}

impl RdmaEventMetrics {
    /// Creates the series (every async `event` at zero) and registers them in `registry`;
    /// `prefix` is `uctel_agent_`.
    ///
    /// # Errors
    /// The registry's error when a name is taken (a bug).
    pub fn register(registry: &Registry, prefix: &str) -> Result<Self, prometheus::Error> {
        let vec = |name: &str, help: &str, labels: &[&str]| {
            let v = IntCounterVec::new(Opts::new(format!("{prefix}{name}"), help), labels)?;
            registry.register(Box::new(v.clone()))?;
            Ok::<_, prometheus::Error>(v)
        };
        let port_state_changes = vec(
            "rdma_port_state_changes_total",
            "RDMA port state changes seen between two host-metrics collections (sysfs ports/<p>/state), by the state the port moved to.",
            &["device", "port", "to"],
        )?;
        let gid_changes = vec(
            "rdma_gid_changes_total",
            "RDMA port GID table entries added, removed or replaced between two host-metrics collections (sysfs ports/<p>/gids/<i>, gid_attrs/types/<i>, gid_attrs/ndevs/<i>).",
            &["device", "port"],
        )?;
        let events = vec(
            "rdma_async_events_total",
            "Asynchronous events (ibv_get_async_event) of the agent's own RDMA device, QP and CQs, by event.",
            &["event"],
        )?;
        Ok(Self {
            port_state_changes,
            gid_changes,
            async_events: AsyncEventKind::ALL.map(|k| events.with_label_values(&[k.as_str()])),
            async_logged: AsyncEventKind::ALL.map(|_| AtomicBool::new(false)),
        })
    }

    /// Counts one port event and logs it, at `info` when it is the first of its kind on its
    /// port ([`PortEvent::first`]), else at `debug`.
    pub fn port_event(&self, e: &PortEvent) {
        let (device, port) = (e.device.as_str(), e.port.as_str());
        match &e.change {
            PortChange::State { from, to } => {
                self.port_state_changes
                    .with_label_values(&[device, port, to.name()])
                    .inc();
                if e.first {
                    tracing::info!(device, port, from = from.name(), to = to.name(), "RDMA port state changed (logged once per port; uctel_agent_rdma_port_state_changes_total counts them all)");
                } else {
                    tracing::debug!(
                        device,
                        port,
                        from = from.name(),
                        to = to.name(),
                        "RDMA port state changed"
                    );
                }
            }
            PortChange::Gid { index, from, to } => {
                self.gid_changes.with_label_values(&[device, port]).inc();
                let show = |g: &Option<_>| {
                    g.as_ref()
                        .map_or_else(String::new, |g: &crate::sources::rdma::GidEntry| {
                            format!("{} {} {}", g.gid, g.gid_type, g.ndev)
                        })
                };
                let (from, to) = (show(from), show(to));
                if e.first {
                    tracing::info!(device, port, index, from = %from, to = %to, "RDMA GID table entry changed (logged once per port; uctel_agent_rdma_gid_changes_total counts them all)");
                } else {
                    tracing::debug!(device, port, index, from = %from, to = %to, "RDMA GID table entry changed");
                }
            }
        }
    }

    /// `rdma_port_state_changes_total{device,port,to}` so far.
    pub fn port_state_changes(&self, device: &str, port: &str, to: &str) -> u64 {
        self.port_state_changes
            .get_metric_with_label_values(&[device, port, to])
            .map_or(0, |c| c.get())
    }

    /// `rdma_gid_changes_total{device,port}` so far.
    pub fn gid_changes(&self, device: &str, port: &str) -> u64 {
        self.gid_changes
            .get_metric_with_label_values(&[device, port])
            .map_or(0, |c| c.get())
    }

    /// Counts one async event of `device` and logs it, at `warn` the first time its kind is
    /// met, at `debug` after.
    pub fn async_event(&self, device: &str, ev: &AsyncEvent) {
        let kind = AsyncEventKind::of(ev);
        self.async_events[kind.index()].inc();
        if !self.async_logged[kind.index()].swap(true, Ordering::Relaxed) {
            tracing::warn!(device, event = kind.as_str(), detail = ?ev, "RDMA async event (logged once per kind; uctel_agent_rdma_async_events_total counts them all)");
        } else {
            tracing::debug!(device, event = kind.as_str(), detail = ?ev, "RDMA async event");
        }
    }

    /// `rdma_async_events_total{event}` so far.
    pub fn async_events(&self, kind: AsyncEventKind) -> u64 {
        self.async_events[kind.index()].get()
    }
}

/// Takes up to [`MAX_EVENTS_PER_POLL`] pending async events from `device` (non-blocking),
/// counts and logs each in `metrics`, and returns the kind of the first one after which the
/// session cannot go on ([`AsyncEventKind::ends_session`]), if any. Every event taken is
/// counted, also those after a fatal one.
pub fn drain_async_events(device: &Device, metrics: &RdmaEventMetrics) -> Option<AsyncEventKind> {
    let mut fatal = None;
    for _ in 0..MAX_EVENTS_PER_POLL {
        let Some(ev) = device.poll_async_event() else {
            break;
        };
        metrics.async_event(device.name(), &ev);
        let kind = AsyncEventKind::of(&ev);
        if kind.ends_session() && fatal.is_none() {
            fatal = Some(kind);
        }
    }
    fatal
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use uctel_transport::api::{AccessFlags, QpInitAttr, QpState, QpType, RecvWr, SendWr, Sge};
    use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
    use uctel_transport::soft::link::MemoryLink;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn metrics() -> RdmaEventMetrics {
        RdmaEventMetrics::register(&Registry::new(), "uctel_agent_")
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn kinds_are_unique_and_indexed() {
        for (i, k) in AsyncEventKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
        let mut names: Vec<&str> = AsyncEventKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), AsyncEventKind::ALL.len());
        assert!(!AsyncEventKind::PortChange.ends_session());
        assert!(AsyncEventKind::QpFatal.ends_session());
    }

    #[test]
    fn every_async_event_is_registered_at_zero() {
        let registry = Registry::new();
        let _m =
            RdmaEventMetrics::register(&registry, "uctel_agent_").unwrap_or_else(|e| panic!("{e}"));
        let fams = registry.gather();
        let fam = fams
            .iter()
            .find(|f| f.name() == "uctel_agent_rdma_async_events_total")
            .unwrap_or_else(|| panic!("not registered"));
        let mut events: Vec<String> = fam
            .get_metric()
            .iter()
            .map(|m| m.get_label()[0].value().to_owned())
            .collect();
        events.sort();
        assert_eq!(
            events,
            ["cq_error", "device_fatal", "port_change", "qp_fatal"]
        );
    }

    #[test]
    fn port_events_are_counted_by_device_port_and_state() {
        use crate::sources::rdma::{GidEntry, PortState};
        let m = metrics();
        let event = |change, first| PortEvent {
            device: "mlx5_0".to_owned(),
            port: "1".to_owned(),
            change,
            first,
        };
        let down = PortChange::State {
            from: PortState(4),
            to: PortState(1),
        };
        m.port_event(&event(down.clone(), true));
        m.port_event(&event(down, false));
        m.port_event(&event(
            PortChange::State {
                from: PortState(1),
                to: PortState(4),
            },
            false,
        ));
        m.port_event(&event(
            PortChange::Gid {
                index: 3,
                from: None,
                to: Some(GidEntry {
                    gid: "fe80:0000:0000:0000:0000:0000:0000:0001".to_owned(),
                    gid_type: "RoCE v2".to_owned(),
                    ndev: "eth0".to_owned(),
                }),
            },
            true,
        ));
        assert_eq!(m.port_state_changes("mlx5_0", "1", "down"), 2);
        assert_eq!(m.port_state_changes("mlx5_0", "1", "active"), 1);
        assert_eq!(m.port_state_changes("mlx5_0", "2", "down"), 0);
        assert_eq!(m.gid_changes("mlx5_0", "1"), 1);
    }

    /// Two soft devices over a memory link; the receiving QP's CQ (depth 2) overflows, which
    /// the soft transport reports as `CqError` + `QpFatal` (`soft/device/shared.rs`).
    #[test]
    fn a_cq_overflow_on_the_soft_transport_is_counted_and_ends_the_session() {
        let (la, lb) = MemoryLink::pair(addr("10.0.0.1:4791"), addr("10.0.0.2:4791"));
        let config = SoftConfig {
            progress: ProgressMode::BusyPoll,
            ..SoftConfig::default()
        };
        let open = |link: MemoryLink| {
            let soft =
                SoftDevice::with_link(&config, Box::new(link)).unwrap_or_else(|e| panic!("{e}"));
            (soft.clone(), Device::from(soft))
        };
        let ((sa, a), (sb, b)) = (open(la), open(lb));
        let make = |dev: &Device, access| {
            let pd = dev.alloc_pd().unwrap_or_else(|e| panic!("{e}"));
            let scq = dev.create_cq(2).unwrap_or_else(|e| panic!("{e}"));
            let rcq = dev.create_cq(2).unwrap_or_else(|e| panic!("{e}"));
            let qp = pd
                .create_qp(&QpInitAttr {
                    qp_type: QpType::Uc,
                    send_cq: &scq,
                    recv_cq: &rcq,
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    access,
                    max_mtu: None,
                })
                .unwrap_or_else(|e| panic!("{e}"));
            (pd, scq, rcq, qp)
        };
        let (pa, _sca, _rca, qa) = make(&a, AccessFlags::LOCAL_WRITE);
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let (pb, _scb, _rcb, qb) = make(&b, remote);
        let ring = pb.reg_mr(4096, remote).unwrap_or_else(|e| panic!("{e}"));
        qa.connect(&qb.local_endpoint())
            .unwrap_or_else(|e| panic!("{e}"));
        qb.connect(&qa.local_endpoint())
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..8 {
            qb.post_recv(&[RecvWr::zero_length(i)])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let src = pa
            .reg_mr(8, AccessFlags::LOCAL_WRITE)
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..6u32 {
            let wr = SendWr::write_with_imm(
                u64::from(i),
                Some(Sge::new(&src, 0, 8)),
                ring.addr(),
                ring.rkey(),
                i,
            );
            qa.post_send(&[wr.with_signaled(false)])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        for _ in 0..1000 {
            let moved = sa.progress().sent + sb.progress().received;
            if moved == 0 && qb.state() == QpState::Error {
                break;
            }
        }
        assert_eq!(qb.state(), QpState::Error);

        let m = metrics();
        assert_eq!(drain_async_events(&a, &m), None, "the sender saw nothing");
        let fatal = drain_async_events(&b, &m);
        assert!(
            matches!(
                fatal,
                Some(AsyncEventKind::CqError | AsyncEventKind::QpFatal)
            ),
            "{fatal:?}"
        );
        assert_eq!(m.async_events(AsyncEventKind::CqError), 1);
        assert_eq!(m.async_events(AsyncEventKind::QpFatal), 1);
        assert_eq!(m.async_events(AsyncEventKind::PortChange), 0);
        // Taken once: the queue is empty now.
        assert_eq!(drain_async_events(&b, &m), None);
        assert_eq!(m.async_events(AsyncEventKind::QpFatal), 1);
    }
}
