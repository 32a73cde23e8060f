//! RC QPs on the soft device through the public API, over an in-memory link with the fault
//! injector in between: every message exactly once and in order under loss in both
//! directions (data and ACKs), retransmission counted, retry exhaustion as an error
//! completion and a fatal QP event, and packets of the other service refused. Every wait is
//! bounded; a hang fails the test.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uctel_transport::api::{
    AccessFlags, AsyncEvent, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpErrorCause,
    QpInitAttr, QpState, QpType, QueuePair, RcAttr, RecvWr, SendWr, Sge, UcDropReason, WcOpcode,
    WcStatus, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::fault::{FaultConfig, FaultDirection, FaultInjector};
use uctel_transport::soft::link::{Datagram, Link, MemoryLink};
use uctel_transport::soft::udp::{UdpConfig, UdpLink};

/// Longest any test waits for progress.
const DEADLINE: Duration = Duration::from_secs(60);

/// A short ACK timeout (4.096 µs × 2^10 ≈ 4 ms) so that tail losses recover quickly.
fn fast_rc(retry_cnt: u8) -> RcAttr {
    RcAttr {
        timeout: 10,
        retry_cnt,
        ..RcAttr::default()
    }
}

struct Node {
    dev: Device,
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
}

impl Node {
    fn new(link: Box<dyn Link>, qp_type: QpType) -> Node {
        let cfg = SoftConfig {
            progress: ProgressMode::Thread,
            progress_wait_micros: 200,
            ..SoftConfig::default()
        };
        let dev = Device::from(SoftDevice::with_link(&cfg, link).expect("device"));
        let pd = dev.alloc_pd().expect("pd");
        let scq = dev.create_cq(4096).expect("cq");
        let rcq = dev.create_cq(4096).expect("cq");
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type,
                send_cq: &scq,
                recv_cq: &rcq,
                max_send_wr: 64,
                max_recv_wr: 256,
                access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                max_mtu: None,
            })
            .expect("qp");
        Node {
            dev,
            pd,
            scq,
            rcq,
            qp,
        }
    }

    fn reg(&self, len: usize) -> MemoryRegion {
        self.pd
            .reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("reg_mr")
    }
}

fn pair(drop_ratio: f64, seed: u64, a_type: QpType, b_type: QpType) -> (Node, Node) {
    pair_with(
        FaultConfig {
            drop_ratio,
            seed,
            direction: FaultDirection::Both,
            ..FaultConfig::default()
        },
        a_type,
        b_type,
    )
}

fn pair_with(faults: FaultConfig, a_type: QpType, b_type: QpType) -> (Node, Node) {
    let (la, lb) = MemoryLink::pair(
        "10.0.0.1:4791".parse().expect("addr"),
        "10.0.0.2:4791".parse().expect("addr"),
    );
    let faulty = |link: MemoryLink, seed: u64| -> Box<dyn Link> {
        Box::new(
            FaultInjector::new(
                link,
                FaultConfig {
                    seed,
                    ..faults.clone()
                },
            )
            .expect("fault config"),
        )
    };
    let a = Node::new(faulty(la, faults.seed), a_type);
    let b = Node::new(faulty(lb, faults.seed ^ 0x5a5a), b_type);
    a.qp.connect(&b.qp.local_endpoint()).expect("connect a");
    b.qp.connect(&a.qp.local_endpoint()).expect("connect b");
    (a, b)
}

/// Message `seq`'s payload: the sequence, then a pattern derived from it.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut p = seq.to_le_bytes().to_vec();
    p.extend((8..len).map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i) as u8));
    p
}

/// Sends `count` messages from `a` to `b` (Write-with-immediate into a ring at `b`, or Send
/// into posted buffers) and checks that each arrives exactly once, in order, byte for byte,
/// and that every send WR completes successfully.
fn transfer(a: &Node, b: &Node, count: u64, len: usize, write: bool) {
    let ring = b.reg(count as usize * len);
    let bufs = b.reg(256 * len);
    let src = a.reg(64 * len);
    let mut posted_recv = 0u64;
    let repost = |from: u64, to: u64| {
        let wrs: Vec<RecvWr<'_>> = (from..to)
            .map(|i| {
                if write {
                    RecvWr::zero_length(i)
                } else {
                    let off = (i % 256) as usize * len;
                    RecvWr::new(i, Sge::new(&bufs, off, len as u32))
                }
            })
            .collect();
        b.qp.post_recv(&wrs).expect("post_recv");
    };
    repost(0, 256.min(count));
    posted_recv += 256.min(count);

    let (mut next, mut acked, mut received) = (0u64, 0u64, 0u64);
    let mut wcs = [WorkCompletion::default(); 64];
    let start = Instant::now();
    while received < count || acked < count {
        assert!(
            start.elapsed() < DEADLINE,
            "stuck: sent {next}, acked {acked}, received {received} of {count}; \
             sender {:?}, receiver {:?}",
            a.qp.stats(),
            b.qp.stats()
        );
        while next < count && next - acked < 64 {
            let slot = (next % 64) as usize * len;
            src.write_at(slot, &payload(next, len)).expect("write src");
            let sge = Some(Sge::new(&src, slot, len as u32));
            let wr = if write {
                SendWr::write_with_imm(
                    next,
                    sge,
                    ring.addr() + next * len as u64,
                    ring.rkey(),
                    next as u32,
                )
            } else {
                SendWr::send(next, sge)
            };
            a.qp.post_send(&[wr]).expect("post_send");
            next += 1;
        }
        let n = a.scq.poll(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "send {wc:?}");
            assert_eq!(wc.wr_id, acked, "send completions in order");
            acked += 1;
        }
        let n = b.rcq.poll(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "recv {wc:?}");
            assert_eq!(wc.wr_id, received, "receive completions in order");
            let mut got = vec![0u8; len];
            if write {
                assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                assert_eq!(wc.imm, Some(received as u32), "exactly once, in order");
                ring.read_at(received as usize * len, &mut got)
                    .expect("ring");
            } else {
                assert_eq!(wc.opcode, WcOpcode::Recv);
                assert_eq!(wc.byte_len as usize, len);
                bufs.read_at((received % 256) as usize * len, &mut got)
                    .expect("buf");
            }
            assert_eq!(got, payload(received, len), "message {received}");
            received += 1;
        }
        if n > 0 && posted_recv < count {
            let more = (count - posted_recv).min(n as u64);
            repost(posted_recv, posted_recv + more);
            posted_recv += more;
        }
        if n == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    assert_eq!(a.qp.state(), QpState::Rts);
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn write_with_imm_under_loss_both_ways_arrives_exactly_once_in_order() {
    let (a, b) = pair(0.05, 7, QpType::Rc(fast_rc(7)), QpType::Rc(fast_rc(7)));
    transfer(&a, &b, 3000, 256, true);
    let (sa, sb) = (a.qp.stats(), b.qp.stats());
    assert!(sa.rc.packets_retransmitted > 0, "{sa:?}");
    assert!(sa.rc.naks_received + sa.rc.timeouts > 0, "{sa:?}");
    assert!(sb.rc.naks_sent > 0, "{sb:?}");
    assert_eq!(sa.rc.retry_exceeded, 0);
    // Nothing was dropped as data loss: UC's loss reasons stay empty on RC.
    assert_eq!(sb.drops.get(UcDropReason::PsnGap), 0);
    assert_eq!(sb.messages_completed, 3000);
}

#[test]
fn every_fault_at_once_still_delivers_exactly_once_in_order() {
    // Drops, duplicates, reordering and corrupted packets (refused by the ICRC check) in
    // both directions, on requests and on ACKs/NAKs alike.
    let faults = FaultConfig {
        drop_ratio: 0.02,
        duplicate_ratio: 0.02,
        reorder_ratio: 0.02,
        reorder_window: 4,
        corrupt_ratio: 0.01,
        seed: 21,
        direction: FaultDirection::Both,
        ..FaultConfig::default()
    };
    let (a, b) = pair_with(faults, QpType::Rc(fast_rc(7)), QpType::Rc(fast_rc(7)));
    transfer(&a, &b, 2000, 300, true);
    let sb = b.qp.stats();
    assert!(sb.rc.duplicates > 0, "{sb:?}");
    assert!(b.dev.stats().drops.get(UcDropReason::BadIcrc) > 0);
}

#[test]
fn multi_packet_sends_under_loss_arrive_exactly_once_in_order() {
    // A 16.8 ms ACK timeout (IBTA 4.096 µs × 2^12), not `fast_rc`'s 4.2 ms: the timer runs
    // on the wall clock, and on a loaded machine a stalled responder thread could otherwise
    // use up all seven retries of one PSN without any datagram being lost.
    let patient = RcAttr {
        timeout: 12,
        retry_cnt: 7,
        ..RcAttr::default()
    };
    let (a, b) = pair(0.03, 11, QpType::Rc(patient), QpType::Rc(patient));
    // 3000 B at the default path MTU (1024): three packets per message.
    transfer(&a, &b, 500, 3000, false);
    assert!(a.qp.stats().rc.packets_retransmitted > 0);
}

#[test]
fn a_lossless_link_needs_no_retransmission() {
    let (a, b) = pair(
        0.0,
        1,
        QpType::Rc(RcAttr::default()),
        QpType::Rc(RcAttr::default()),
    );
    transfer(&a, &b, 1000, 128, true);
    let sa = a.qp.stats();
    assert_eq!(sa.rc.packets_retransmitted, 0, "{sa:?}");
    assert_eq!(sa.rc.timeouts, 0);
    assert_eq!(b.qp.stats().rc.naks_sent, 0);
    assert_eq!(a.qp.qp_type(), QpType::Rc(RcAttr::default()));
}

#[test]
fn a_silent_peer_exhausts_the_retries_and_fails_the_qp() {
    // Everything is lost: no ACK ever comes back.
    let (a, _b) = pair(1.0, 3, QpType::Rc(fast_rc(2)), QpType::Rc(fast_rc(2)));
    let src = a.reg(64);
    a.qp.post_send(&[SendWr::send(42, Some(Sge::new(&src, 0, 64)))])
        .expect("post");
    let mut wcs = [WorkCompletion::default(); 4];
    let start = Instant::now();
    let wc = loop {
        assert!(
            start.elapsed() < DEADLINE,
            "no completion: {:?}",
            a.qp.stats()
        );
        if a.scq.poll(&mut wcs) > 0 {
            break wcs[0];
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!((wc.wr_id, wc.status), (42, WcStatus::RetryExceededError));
    assert_eq!(a.qp.state(), QpState::Error);
    let stats = a.qp.stats();
    // The first send and two retries, each ended by the timer.
    assert_eq!(stats.rc.timeouts, 3, "{stats:?}");
    assert_eq!(stats.rc.retry_exceeded, 1);
    assert_eq!(stats.rc.packets_retransmitted, 2);
    let qpn = a.qp.qp_num();
    let events: Vec<AsyncEvent> = std::iter::from_fn(|| a.dev.poll_async_event()).collect();
    assert!(
        events.contains(&AsyncEvent::QpFatal {
            qpn,
            cause: QpErrorCause::RetryExceeded
        }),
        "{events:?}"
    );
}

#[test]
fn packets_of_the_other_service_are_refused() {
    // A UC requester talking to an RC responder (a misconfigured peer): every UC packet is
    // dropped by the RC QP as malformed, nothing is placed, nothing is ACKed.
    let (a, b) = pair(0.0, 5, QpType::Uc, QpType::Rc(RcAttr::default()));
    let ring = b.reg(4096);
    let src = a.reg(64);
    b.qp.post_recv(&[RecvWr::zero_length(0)])
        .expect("post_recv");
    for i in 0..10 {
        a.qp.post_send(&[SendWr::write_with_imm(
            i,
            Some(Sge::new(&src, 0, 64)),
            ring.addr(),
            ring.rkey(),
            i as u32,
        )])
        .expect("post");
    }
    let start = Instant::now();
    while b.qp.stats().packets_received < 10 {
        assert!(start.elapsed() < DEADLINE, "{:?}", b.qp.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let sb = b.qp.stats();
    assert_eq!(sb.drops.get(UcDropReason::Malformed), 10, "{sb:?}");
    assert_eq!(sb.messages_completed, 0);
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(b.rcq.poll(&mut wcs), 0);
    assert_eq!(a.qp.qp_type(), QpType::Uc);
}

/// A node on a real UDP socket on loopback (the progress thread sleeps on the socket).
fn udp_node(drop_ratio: f64, seed: u64, qp_type: QpType) -> Node {
    let udp = UdpLink::bind(UdpConfig {
        bind: "127.0.0.1:0".parse().expect("addr"),
        ..UdpConfig::default()
    })
    .expect("udp");
    let link = FaultInjector::new(
        udp,
        FaultConfig {
            drop_ratio,
            seed,
            direction: FaultDirection::Send,
            ..FaultConfig::default()
        },
    )
    .expect("fault config");
    Node::new(Box::new(link), qp_type)
}

#[test]
fn over_udp_a_post_that_arms_the_timer_wakes_the_sleeping_progress_thread() {
    // The progress thread sleeps on its socket with no timer running; the post sends the
    // packet itself and arms the retransmit timer. Every packet is lost, so only the timer
    // can move the QP: to RetryExceeded after the first send and one retry.
    let a = udp_node(1.0, 3, QpType::Rc(fast_rc(1)));
    let b = udp_node(0.0, 4, QpType::Rc(fast_rc(1)));
    a.qp.connect(&b.qp.local_endpoint()).expect("connect a");
    b.qp.connect(&a.qp.local_endpoint()).expect("connect b");
    // Let the progress thread go to sleep first.
    std::thread::sleep(Duration::from_millis(50));
    let src = a.reg(64);
    a.qp.post_send(&[SendWr::send(9, Some(Sge::new(&src, 0, 64)))])
        .expect("post");
    let mut wcs = [WorkCompletion::default(); 4];
    let start = Instant::now();
    let wc = loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the timer never fired: {:?}",
            a.qp.stats()
        );
        if a.scq.poll(&mut wcs) > 0 {
            break wcs[0];
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RetryExceededError));
    assert_eq!(a.qp.stats().rc.timeouts, 2);
}

#[test]
fn over_udp_a_long_paced_lossy_stream_arrives_whole() {
    let a = udp_node(0.01, 9, QpType::Rc(fast_rc(7)));
    let b = udp_node(0.01, 10, QpType::Rc(fast_rc(7)));
    a.qp.connect(&b.qp.local_endpoint()).expect("connect a");
    b.qp.connect(&a.qp.local_endpoint()).expect("connect b");
    transfer(&a, &b, 20_000, 1000, true);
}

/// One hostile datagram: (opcode, addressed to the QP or to another QPN, PSN offset from the
/// expected one, AckReq, extension and payload bytes, corrupt the ICRC).
type Hostile = (u8, bool, i32, bool, Vec<u8>, bool);

/// The datagram `h` describes for the RC QP `qpn` expecting `epsn`: an opcode from the RC and
/// UC sets or any byte, arbitrary extension and payload bytes, and a valid ICRC for `from` →
/// `to` (so it reaches the QP) unless `h` says to corrupt it.
fn hostile(h: &Hostile, qpn: u32, epsn: u32, from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let (opcode, ours, dpsn, ack_req, tail, bad_icrc) = h;
    let dest_qpn = if *ours { qpn } else { 0x4242 };
    let psn = epsn.wrapping_add_signed(*dpsn);
    let mut p = vec![*opcode, 0, 0xff, 0xff, 0];
    p.extend_from_slice(&dest_qpn.to_be_bytes()[1..]);
    p.push(if *ack_req { 0x80 } else { 0 });
    p.extend_from_slice(&(psn & 0x00ff_ffff).to_be_bytes()[1..]);
    p.extend_from_slice(tail);
    let pad = (4 - p.len() % 4) % 4;
    p[1] |= (pad as u8) << 4;
    p.extend(std::iter::repeat_n(0, pad + 4));
    uctel_transport::soft::icrc::seal(&mut p, from, to).expect("seal");
    if *bad_icrc {
        let last = p.len() - 1;
        p[last] ^= 0x5a;
    }
    p
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever arrives, the device neither panics nor loses count: every datagram is a
    /// device drop (malformed, bad ICRC, unknown QPN) or reaches the QP.
    #[test]
    fn hostile_datagrams_to_an_rc_qp_are_counted_and_never_panic(
        packets in proptest::collection::vec(
            (
                proptest::prop_oneof![0x00u8..=0x11, 0x20u8..=0x2b, proptest::num::u8::ANY],
                proptest::bool::weighted(0.9),
                -4i32..8,
                proptest::bool::ANY,
                proptest::collection::vec(proptest::num::u8::ANY, 0..80),
                proptest::bool::weighted(0.05),
            ),
            1..120,
        )
    ) {
        let me: SocketAddr = "10.0.0.1:4791".parse().expect("addr");
        let (mut wire, lb) = MemoryLink::pair(me, "10.0.0.2:4791".parse().expect("addr"));
        let b = Node::new(Box::new(lb), QpType::Rc(fast_rc(7)));
        let peer_psn = 1000;
        b.qp.connect(&uctel_transport::api::QpEndpoint {
            gid: uctel_transport::api::gid_from_ip(me.ip()),
            qpn: 0x99,
            psn: peer_psn,
            mtu: 1024,
            udp_addr: Some(me),
        })
        .expect("connect");
        let ring = b.reg(4096);
        let wrs: Vec<RecvWr<'_>> = (0..64)
            .map(|i| RecvWr::new(i, Sge::new(&ring, (i as usize % 16) * 256, 256)))
            .collect();
        b.qp.post_recv(&wrs).expect("post_recv");
        let to = b.qp.local_endpoint().destination();
        let batch: Vec<Datagram> = packets
            .iter()
            .map(|h| Datagram {
                peer: to,
                local: None,
                payload: hostile(h, b.qp.qp_num(), peer_psn, me, to),
            })
            .collect();
        wire.send(&batch).expect("send");
        let n = batch.len() as u64;
        // The device counts a batch as received before it processes it: wait for the
        // processing, bounded.
        let start = Instant::now();
        let accounted = || b.dev.stats().drops.total() + b.qp.stats().packets_received;
        while accounted() < n && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let device = b.dev.stats();
        let qp = b.qp.stats();
        proptest::prop_assert_eq!(device.packets_received, n);
        proptest::prop_assert_eq!(
            device.drops.total() + qp.packets_received,
            n,
            "{:?} {:?}",
            device,
            qp
        );
    }
}
