//! Soft device tests through the public API over an in-memory link: demultiplexing, ICRC,
//! memory placement, CQs, async events, post errors and both progress modes. Every wait is a
//! bounded loop; a hang fails the test.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uctel_transport::api::{
    AccessFlags, AsyncEvent, CompletionQueue, Device, MemoryRegion, Mtu, PostRecvErrorKind,
    PostSendErrorKind, ProtectionDomain, QpErrorCause, QpInitAttr, QpState, QpType, QueuePair,
    RecvWr, SendWr, Sge, UcDropReason, WcOpcode, WcStatus, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::link::{Datagram, Link, MemoryLink};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE;
const MAX_ROUNDS: usize = 100_000;

fn rw_remote() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

fn config(progress: ProgressMode) -> SoftConfig {
    SoftConfig {
        progress,
        progress_wait_micros: 200,
        ..SoftConfig::default()
    }
}

/// A link decorator that rewrites every `every`-th datagram it sends.
struct Mangle<L> {
    inner: L,
    every: usize,
    count: usize,
    how: fn(&mut Vec<u8>),
}

impl<L: Link> Link for Mangle<L> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn send(&mut self, batch: &[Datagram]) -> io::Result<usize> {
        let mut out = Vec::with_capacity(batch.len());
        for d in batch {
            self.count += 1;
            let mut d = d.clone();
            if self.count % self.every == 0 {
                (self.how)(&mut d.payload);
            }
            out.push(d);
        }
        self.inner.send(&out)
    }
    fn recv(
        &mut self,
        out: &mut Vec<Datagram>,
        max: usize,
        t: Option<Duration>,
    ) -> io::Result<usize> {
        self.inner.recv(out, max, t)
    }
}

struct Node {
    soft: SoftDevice,
    dev: Device,
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
}

impl Node {
    fn new(
        link: Box<dyn Link>,
        progress: ProgressMode,
        cq_depth: u32,
        access: AccessFlags,
    ) -> Node {
        let soft = SoftDevice::with_link(&config(progress), link).expect("device");
        let dev = Device::from(soft.clone());
        let pd = dev.alloc_pd().expect("pd");
        let scq = dev.create_cq(cq_depth).expect("cq");
        let rcq = dev.create_cq(cq_depth).expect("cq");
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Uc,
                send_cq: &scq,
                recv_cq: &rcq,
                max_send_wr: 64,
                max_recv_wr: 64,
                access,
                max_mtu: None,
            })
            .expect("qp");
        Node {
            soft,
            dev,
            pd,
            scq,
            rcq,
            qp,
        }
    }

    fn reg(&self, len: usize, access: AccessFlags) -> MemoryRegion {
        self.pd.reg_mr(len, access).expect("reg_mr")
    }
}

fn connect(a: &Node, b: &Node) {
    a.qp.connect(&b.qp.local_endpoint()).expect("connect a");
    b.qp.connect(&a.qp.local_endpoint()).expect("connect b");
    assert_eq!(a.qp.state(), QpState::Rts);
}

/// Agent `a` (10.0.0.1) and collector `b` (10.0.0.2) over a memory link, connected.
fn pair_with(
    progress: ProgressMode,
    cq_depth: u32,
    wrap: impl FnOnce(MemoryLink) -> Box<dyn Link>,
) -> (Node, Node) {
    let (la, lb) = MemoryLink::pair(addr("10.0.0.1:4791"), addr("10.0.0.2:4791"));
    let a = Node::new(wrap(la), progress, cq_depth, RW);
    let b = Node::new(Box::new(lb), progress, cq_depth, rw_remote());
    connect(&a, &b);
    (a, b)
}

fn pair(progress: ProgressMode) -> (Node, Node) {
    pair_with(progress, 256, |l| Box::new(l))
}

/// Polls `cq` (and `other`, to drive the other device in busy-poll mode) until `want`
/// completions arrived or the bound is hit.
fn poll_n(cq: &CompletionQueue, other: &CompletionQueue, want: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 32];
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..MAX_ROUNDS {
        let n = cq.poll(&mut buf);
        out.extend_from_slice(&buf[..n]);
        if out.len() >= want {
            return out;
        }
        let _ = other.poll(&mut []);
        if Instant::now() > deadline {
            break;
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    out
}

/// Drives both devices until nothing moves for a few rounds.
fn settle(a: &Node, b: &Node) {
    settle_devices(&a.soft, &b.soft);
}

fn settle_devices(a: &SoftDevice, b: &SoftDevice) {
    let mut idle = 0;
    for _ in 0..MAX_ROUNDS {
        let ra = a.progress();
        let rb = b.progress();
        if ra.sent + ra.received + rb.sent + rb.received == 0 {
            idle += 1;
            if idle > 3 {
                return;
            }
        } else {
            idle = 0;
        }
    }
    panic!("devices never settled");
}

#[test]
fn write_with_imm_frames_land_in_the_ring_busy_poll() {
    let (a, b) = pair(ProgressMode::BusyPoll);
    let slots = 16usize;
    let slot = 1024usize;
    let ring = b.reg(slots * slot, rw_remote());
    let src = a.reg(slot, RW);
    for i in 0..64 {
        b.qp.post_recv(&[RecvWr::zero_length(i)])
            .expect("post_recv");
    }
    let mut received = Vec::new();
    for seq in 0..64u32 {
        let frame = vec![seq as u8; slot];
        src.write_at(0, &frame).unwrap();
        let va = ring.addr() + (seq as usize % slots * slot) as u64;
        let wr = SendWr::write_with_imm(
            u64::from(seq),
            Some(Sge::new(&src, 0, slot as u32)),
            va,
            ring.rkey(),
            seq,
        );
        a.qp.post_send(&[wr]).expect("post_send");
        // The source buffer is reused: wait for this frame before writing the next.
        let wcs = poll_n(&b.rcq, &a.scq, 1);
        assert_eq!(wcs.len(), 1, "frame {seq} arrived");
        let wc = wcs[0];
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len, wc.imm),
            (
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                slot as u32,
                Some(seq)
            )
        );
        assert_eq!(wc.qp_num, b.qp.qp_num());
        let mut got = vec![0u8; slot];
        ring.read_at(seq as usize % slots * slot, &mut got).unwrap();
        assert_eq!(got, frame);
        received.push(wc.imm);
    }
    let send_wcs = poll_n(&a.scq, &b.rcq, 64);
    assert_eq!(send_wcs.len(), 64);
    assert!(send_wcs
        .iter()
        .all(|w| w.opcode == WcOpcode::RdmaWrite && w.status == WcStatus::Success));
    assert_eq!(b.qp.stats().messages_completed, 64);
    assert_eq!(b.qp.stats().drops.total(), 0);
    assert_eq!(b.dev.stats().drops.total(), 0);
    assert_eq!(a.qp.stats().packets_sent, 64);
}

#[test]
fn sends_scatter_into_receive_buffers_across_packets() {
    let (a, b) = pair(ProgressMode::BusyPoll);
    let buf = b.reg(8192, RW);
    let src = a.reg(3000, RW);
    let data: Vec<u8> = (0..3000).map(|i| (i * 7 + 1) as u8).collect();
    src.write_at(0, &data).unwrap();
    b.qp.post_recv(&[RecvWr::new(5, Sge::new(&buf, 100, 4000))])
        .unwrap();
    a.qp.post_send(&[SendWr::send_with_imm(
        1,
        Some(Sge::new(&src, 0, 3000)),
        0x0102_0304,
    )])
    .unwrap();
    let wcs = poll_n(&b.rcq, &a.scq, 1);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].byte_len, wcs[0].imm),
        (5, WcOpcode::Recv, 3000, Some(0x0102_0304))
    );
    let mut got = vec![0u8; 3000];
    buf.read_at(100, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(b.qp.stats().packets_received, 3, "3000 B at MTU 1024");
}

#[test]
fn threaded_progress_delivers_without_polling_driving_it() {
    let (a, b) = pair(ProgressMode::Thread);
    let ring = b.reg(64 * 256, rw_remote());
    let src = a.reg(256, RW);
    for i in 0..64 {
        b.qp.post_recv(&[RecvWr::zero_length(i)]).unwrap();
    }
    let wrs: Vec<SendWr<'_>> = (0..64u32)
        .map(|i| {
            SendWr::write_with_imm(
                u64::from(i),
                Some(Sge::new(&src, 0, 256)),
                ring.addr() + u64::from(i) * 256,
                ring.rkey(),
                i,
            )
        })
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let wcs = poll_n(&b.rcq, &a.scq, 64);
    let imms: Vec<u32> = wcs.iter().filter_map(|w| w.imm).collect();
    assert_eq!(imms, (0..64).collect::<Vec<_>>());
}

#[test]
fn corrupted_and_malformed_packets_are_counted_by_the_device() {
    #[allow(clippy::ptr_arg)] // must match `truncate`'s signature
    fn flip(p: &mut Vec<u8>) {
        if let Some(b) = p.get_mut(20) {
            *b ^= 0x40;
        }
    }
    fn truncate(p: &mut Vec<u8>) {
        p.truncate(10);
    }
    for (how, reason) in [
        (flip as fn(&mut Vec<u8>), UcDropReason::BadIcrc),
        (truncate, UcDropReason::Malformed),
    ] {
        let (a, b) = pair_with(ProgressMode::BusyPoll, 256, |l| {
            Box::new(Mangle {
                inner: l,
                every: 4,
                count: 0,
                how,
            })
        });
        let ring = b.reg(4096, rw_remote());
        let src = a.reg(64, RW);
        for i in 0..20 {
            b.qp.post_recv(&[RecvWr::zero_length(i)]).unwrap();
        }
        for i in 0..20u32 {
            let wr = SendWr::write_with_imm(
                u64::from(i),
                Some(Sge::new(&src, 0, 64)),
                ring.addr(),
                ring.rkey(),
                i,
            );
            a.qp.post_send(&[wr]).unwrap();
        }
        settle(&a, &b);
        let wcs = poll_n(&b.rcq, &a.scq, 15);
        let imms: Vec<u32> = wcs.iter().filter_map(|w| w.imm).collect();
        let want: Vec<u32> = (0..20).filter(|i| (i + 1) % 4 != 0).collect();
        assert_eq!(imms, want);
        let ds = b.dev.stats();
        assert_eq!(ds.drops.get(reason), 5, "{reason}");
        assert_eq!(ds.drops.total(), 5);
        assert_eq!(ds.packets_received, 20);
        // Lost one-packet messages: the QP only sees the resyncs (the last loss, frame 19,
        // is followed by nothing).
        assert_eq!(b.qp.stats().drops.total(), 0);
        assert_eq!(b.qp.stats().psn_resyncs, 4);
    }
}

#[test]
fn packets_for_unknown_qps_and_from_strangers_are_counted() {
    let (la, lb) = MemoryLink::pair(addr("10.0.0.1:4791"), addr("10.0.0.2:4791"));
    let a = Node::new(Box::new(la), ProgressMode::BusyPoll, 64, RW);
    let b = Node::new(Box::new(lb), ProgressMode::BusyPoll, 64, rw_remote());
    // a talks to a QPN that does not exist on b.
    let mut wrong = b.qp.local_endpoint();
    wrong.qpn = 0x00ab_cdef;
    a.qp.connect(&wrong).unwrap();
    a.qp.post_send(&[SendWr::send(1, None)]).unwrap();
    settle(&a, &b);
    assert_eq!(b.dev.stats().drops.get(UcDropReason::UnknownQpn), 1);

    // b's QP believes its peer is 10.0.0.9: packets from 10.0.0.1 are refused.
    let qp2 =
        a.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: &a.scq,
            recv_cq: &a.rcq,
            max_send_wr: 4,
            max_recv_wr: 4,
            access: RW,
            max_mtu: None,
        })
        .unwrap();
    let mut liar = qp2.local_endpoint();
    liar.udp_addr = Some(addr("10.0.0.9:4791"));
    b.qp.connect(&liar).unwrap();
    b.qp.post_recv(&[RecvWr::zero_length(1)]).unwrap();
    qp2.connect(&b.qp.local_endpoint()).unwrap();
    qp2.post_send(&[SendWr::send(2, None)]).unwrap();
    settle(&a, &b);
    assert_eq!(b.qp.stats().drops.get(UcDropReason::AddressMismatch), 1);
    assert_eq!(b.qp.stats().drops.total(), 1);
}

#[test]
fn receive_cq_overflow_raises_events_and_flushes() {
    let (a, b) = pair_with(ProgressMode::BusyPoll, 4, |l| Box::new(l));
    let ring = b.reg(4096, rw_remote());
    let src = a.reg(8, RW);
    for i in 0..8 {
        b.qp.post_recv(&[RecvWr::zero_length(i)]).unwrap();
    }
    for i in 0..6u32 {
        a.qp.post_send(&[SendWr::write_with_imm(
            u64::from(i),
            Some(Sge::new(&src, 0, 8)),
            ring.addr(),
            ring.rkey(),
            i,
        )
        .with_signaled(false)])
            .unwrap();
    }
    settle(&a, &b);
    assert_eq!(b.qp.state(), QpState::Error);
    let mut events = Vec::new();
    while let Some(e) = b.dev.poll_async_event() {
        events.push(e);
    }
    assert!(
        events.contains(&AsyncEvent::QpFatal {
            qpn: b.qp.qp_num(),
            cause: QpErrorCause::RecvCqOverflow
        }),
        "{events:?}"
    );
    assert!(
        events.contains(&AsyncEvent::CqError { cq: b.rcq.handle() }),
        "{events:?}"
    );
    let s = b.qp.stats();
    assert_eq!(s.drops.get(UcDropReason::CqOverflow), 1);
    assert_eq!(
        s.drops.get(UcDropReason::QpError),
        1,
        "the sixth write arrived at a QP in ERROR"
    );
    // Four successes, then (as the CQ drains) the three WRs left flush.
    let wcs = poll_n(&b.rcq, &a.scq, 7);
    let statuses: Vec<WcStatus> = wcs.iter().map(|w| w.status).collect();
    assert_eq!(statuses[..4], [WcStatus::Success; 4]);
    assert_eq!(statuses[4..], [WcStatus::WrFlushError; 3]);
    assert_eq!(
        wcs[4..].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [5, 6, 7]
    );
    // post_send on a QP in ERROR is refused; post_recv is flushed at once.
    let err = b.qp.post_send(&[SendWr::send(1, None)]).unwrap_err();
    assert_eq!(
        err.kind,
        PostSendErrorKind::InvalidState {
            state: QpState::Error
        }
    );
    b.qp.post_recv(&[RecvWr::zero_length(99)]).unwrap();
    let wcs = poll_n(&b.rcq, &a.scq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (99, WcStatus::WrFlushError));
}

#[test]
fn post_errors_name_the_failing_wr() {
    let (a, b) = pair(ProgressMode::BusyPoll);
    let mr = a.reg(100, RW);
    let other = b.reg(100, RW);
    let ok = SendWr::send(1, Some(Sge::new(&mr, 0, 100)));
    let oob = SendWr::send(2, Some(Sge::new(&mr, 50, 51)));
    let err = a.qp.post_send(&[ok, ok, oob]).unwrap_err();
    assert_eq!(err.posted, 2);
    assert!(matches!(
        err.kind,
        PostSendErrorKind::SgeOutOfBounds {
            offset: 50,
            length: 51,
            mr_len: 100,
            ..
        }
    ));
    let err =
        a.qp.post_send(&[SendWr::send(3, Some(Sge::new(&other, 0, 1)))])
            .unwrap_err();
    assert!(
        matches!(err.kind, PostSendErrorKind::ForeignMr { .. }),
        "{err}"
    );
    // A list longer than the send queue: the rest is refused as Full (cheap to test).
    let many = vec![SendWr::send(4, None); 65];
    let err = a.qp.post_send(&many).unwrap_err();
    assert!(err.is_full(), "{err}");
    // In busy-poll mode the earlier WRs already went out, so the queue was empty.
    assert_eq!(err.posted, 64);

    let ro = b.reg(64, AccessFlags::NONE);
    let err =
        b.qp.post_recv(&[RecvWr::new(1, Sge::new(&ro, 0, 64))])
            .unwrap_err();
    assert_eq!(
        err.kind,
        PostRecvErrorKind::NoLocalWrite { lkey: ro.lkey() }
    );
    let big = vec![RecvWr::zero_length(0); 65];
    let err = b.qp.post_recv(&big).unwrap_err();
    assert!(err.is_full());
    assert_eq!(err.posted, 64);

    // post_send before connect is refused.
    let c =
        a.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: &a.scq,
            recv_cq: &a.rcq,
            max_send_wr: 4,
            max_recv_wr: 4,
            access: RW,
            max_mtu: Some(Mtu::Mtu256),
        })
        .unwrap();
    assert_eq!(c.state(), QpState::Init);
    assert_eq!(c.local_endpoint().mtu, 256);
    let err = c.post_send(&[SendWr::send(1, None)]).unwrap_err();
    assert_eq!(
        err.kind,
        PostSendErrorKind::InvalidState {
            state: QpState::Init
        }
    );
    assert!(c
        .connect(&uctel_transport::api::QpEndpoint {
            mtu: 1000,
            ..b.qp.local_endpoint()
        })
        .is_err());
}

#[test]
fn dropped_handles_deregister_and_destroy() {
    let (a, b) = pair(ProgressMode::BusyPoll);
    let ring = b.reg(4096, rw_remote());
    let (addr_, rkey) = (ring.addr(), ring.rkey());
    drop(ring);
    let src = a.reg(8, RW);
    b.qp.post_recv(&[RecvWr::zero_length(1)]).unwrap();
    a.qp.post_send(&[SendWr::write_with_imm(
        1,
        Some(Sge::new(&src, 0, 8)),
        addr_,
        rkey,
        1,
    )])
    .unwrap();
    settle(&a, &b);
    assert_eq!(b.qp.stats().drops.get(UcDropReason::BadRkey), 1);
    let qpn = b.qp.qp_num();
    drop(b.qp);
    a.qp.post_send(&[SendWr::send(2, None)]).unwrap();
    settle_devices(&a.soft, &b.soft);
    assert_eq!(
        b.dev.stats().drops.get(UcDropReason::UnknownQpn),
        1,
        "QP {qpn:#x} is gone"
    );
}
