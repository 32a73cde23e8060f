//! The asynchronous events (`ibv_get_async_event`) of the collector's RDMA device:
//! `uctel_collector_rdma_async_events_total{event}` (`qp_fatal`, `cq_error`, `port_change`,
//! `device_fatal`, `srq_limit`, `srq_error`, every one at zero from the start; each kind logged
//! once at `warn`, later ones at `debug`), and which connections an event ends.
//!
//! The data-plane worker ([`crate::dataplane`]) takes the pending events at every stats fold
//! (every 100 ms, every second while idle). `qp_fatal` names a QP and `cq_error` a CQ: the
//! connection that owns it is marked failed at once (`qp_errors_total{agent}`, the control
//! plane rebuilds it), without waiting for the QP-state check of the next fold.
//! `device_fatal` fails every connection (every object on the device is unusable).
//! `port_change` is only counted and logged: a port that comes back carries the same QPs.
//! `srq_error` names the worker's shared receive queue: every connection on it fails (its QP
//! receives nothing more) and later connections keep receive queues of their own.
//! `srq_limit` says the SRQ ran below the limit the worker armed (an eighth of its target):
//! counted and logged; the worker arms it again once its top-up restored the target.

use uctel_transport::api::{AsyncEvent, Device};

/// Most events taken per call of [`drain`], so an event storm cannot stall the worker.
pub const MAX_EVENTS_PER_FOLD: usize = 64;

/// Number of event kinds ([`EVENT_LABELS`]).
pub const EVENT_KINDS: usize = 6;

/// The `event` label of `uctel_collector_rdma_async_events_total`, in a fixed order (the
/// position is the index of the per-kind handles).
pub const EVENT_LABELS: [&str; EVENT_KINDS] = [
    "qp_fatal",
    "cq_error",
    "port_change",
    "device_fatal",
    "srq_limit",
    "srq_error",
];

/// The position of `ev`'s label in [`EVENT_LABELS`].
pub fn event_index(ev: &AsyncEvent) -> usize {
    match ev {
        AsyncEvent::QpFatal { .. } => 0,
        AsyncEvent::CqError { .. } => 1,
        AsyncEvent::PortChange { .. } => 2,
        AsyncEvent::DeviceFatal => 3,
        AsyncEvent::SrqLimitReached { .. } => 4,
        AsyncEvent::SrqError { .. } => 5,
    }
}

/// Whether `ev` ends the connection whose QP is `qpn`, whose CQs have the handles `cqs` and
/// which takes its receive WRs from the SRQ with handle `srq` (`None`: a receive queue of its
/// own).
pub fn ends_connection(ev: &AsyncEvent, qpn: u32, cqs: [u32; 2], srq: Option<u32>) -> bool {
    match ev {
        AsyncEvent::QpFatal { qpn: q, .. } => *q == qpn,
        AsyncEvent::CqError { cq } => cqs.contains(cq),
        AsyncEvent::PortChange { .. } | AsyncEvent::SrqLimitReached { .. } => false,
        AsyncEvent::SrqError { srq: h } => srq == Some(*h),
        AsyncEvent::DeviceFatal => true,
    }
}

/// Takes up to [`MAX_EVENTS_PER_FOLD`] pending events of `device` (non-blocking), hands each
/// to `count` with the device name (the worker counts and logs it with
/// [`crate::telemetry::Telemetry::rdma_async_event`]), and returns them.
pub fn drain(device: &Device, mut count: impl FnMut(&str, &AsyncEvent)) -> Vec<AsyncEvent> {
    let mut events = Vec::new();
    while events.len() < MAX_EVENTS_PER_FOLD {
        let Some(ev) = device.poll_async_event() else {
            break;
        };
        count(device.name(), &ev);
        events.push(ev);
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Telemetry;
    use std::net::SocketAddr;
    use uctel_transport::api::{
        AccessFlags, QpErrorCause, QpInitAttr, QpState, QpType, RecvWr, SendWr, Sge,
    };
    use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
    use uctel_transport::soft::link::MemoryLink;

    #[test]
    fn which_connection_an_event_ends() {
        let fatal = AsyncEvent::QpFatal {
            qpn: 7,
            cause: QpErrorCause::Device,
        };
        assert!(ends_connection(&fatal, 7, [1, 2], None));
        assert!(!ends_connection(&fatal, 8, [1, 2], None));
        assert!(ends_connection(
            &AsyncEvent::CqError { cq: 2 },
            8,
            [1, 2],
            None
        ));
        assert!(!ends_connection(
            &AsyncEvent::CqError { cq: 3 },
            8,
            [1, 2],
            None
        ));
        let port = AsyncEvent::PortChange {
            port: 1,
            active: false,
        };
        assert!(!ends_connection(&port, 7, [1, 2], Some(4)));
        assert!(ends_connection(&AsyncEvent::DeviceFatal, 7, [1, 2], None));
        // An SRQ error ends the connections on that SRQ only; a limit event ends none.
        let srq_err = AsyncEvent::SrqError { srq: 4 };
        assert!(ends_connection(&srq_err, 7, [1, 2], Some(4)));
        assert!(!ends_connection(&srq_err, 7, [1, 2], Some(5)));
        assert!(!ends_connection(&srq_err, 7, [1, 2], None));
        let limit = AsyncEvent::SrqLimitReached { srq: 4 };
        assert!(!ends_connection(&limit, 7, [1, 2], Some(4)));
        let all = [
            fatal,
            AsyncEvent::CqError { cq: 2 },
            port,
            AsyncEvent::DeviceFatal,
            limit,
            srq_err,
        ];
        let idx: Vec<usize> = all.iter().map(event_index).collect();
        assert_eq!(idx, [0, 1, 2, 3, 4, 5]);
    }

    fn sample(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(series).map(|v| v.trim().to_owned()))
    }

    /// A real receive-CQ overflow on the soft transport (`soft/device/shared.rs` pushes
    /// `QpFatal` and `CqError`): both are counted, and both name the overflowing connection.
    #[test]
    fn soft_transport_cq_overflow_is_counted_and_names_the_connection() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}"));
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
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let make = |dev: &Device| {
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
                    access: remote,
                    max_mtu: None,
                })
                .unwrap_or_else(|e| panic!("{e}"));
            (pd, scq, rcq, qp)
        };
        let (pa, _sca, _rca, qa) = make(&a);
        let (pb, scb, rcb, qb) = make(&b);
        qa.connect(&qb.local_endpoint())
            .unwrap_or_else(|e| panic!("{e}"));
        qb.connect(&qa.local_endpoint())
            .unwrap_or_else(|e| panic!("{e}"));
        let ring = pb.reg_mr(4096, remote).unwrap_or_else(|e| panic!("{e}"));
        let src = pa
            .reg_mr(8, AccessFlags::LOCAL_WRITE)
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..8 {
            qb.post_recv(&[RecvWr::zero_length(i)])
                .unwrap_or_else(|e| panic!("{e}"));
        }
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
            if sa.progress().sent + sb.progress().received == 0 && qb.state() == QpState::Error {
                break;
            }
        }
        assert_eq!(qb.state(), QpState::Error);

        let tel = Telemetry::new().unwrap_or_else(|e| panic!("{e}"));
        let text = |tel: &Telemetry| {
            String::from_utf8(tel.render().unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let series =
            |event: &str| format!("uctel_collector_rdma_async_events_total{{event=\"{event}\"}}");
        for event in EVENT_LABELS {
            assert_eq!(sample(&text(&tel), &series(event)).as_deref(), Some("0"));
        }
        let count = |d: &str, ev: &AsyncEvent| tel.rdma_async_event(d, ev);
        assert!(drain(&a, count).is_empty());
        let events = drain(&b, count);
        assert_eq!(events.len(), 2, "{events:?}");
        let (qpn, cqs) = (qb.qp_num(), [rcb.handle(), scb.handle()]);
        assert!(
            events.iter().all(|e| ends_connection(e, qpn, cqs, None)),
            "{events:?}"
        );
        assert!(!events
            .iter()
            .any(|e| ends_connection(e, qpn + 1, [u32::MAX; 2], None)));
        let t = text(&tel);
        assert_eq!(sample(&t, &series("qp_fatal")).as_deref(), Some("1"), "{t}");
        assert_eq!(sample(&t, &series("cq_error")).as_deref(), Some("1"), "{t}");
        assert!(drain(&b, count).is_empty(), "taken once");
    }
}
