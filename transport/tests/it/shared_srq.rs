//! Many UC QPs on one shared CQ and one shared receive queue, over real UDP on 127.0.0.1
//! (issue 42, DESIGN.md §6): 64 sender QPs write with immediate into 64 receiver QPs that
//! complete into one CQ and take their receive WRs from one SRQ. Each completion names its
//! QP (`qp_num`), the SRQ's WRs are consumed one per Write-with-immediate and per SEND, a QP
//! in ERROR leaves the SRQ's WRs to the others, and the device lists as changed only the
//! QPs a drop was counted on.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uctel_transport::api::{
    AccessFlags, Device, PostRecvErrorKind, QpInitAttr, QpType, QueuePair, RecvWr, SendWr, Sge,
    UcDropReason, WcOpcode, WcStatus, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::udp::UdpConfig;

const QPS: usize = 64;
const FRAMES_PER_QP: u32 = 20;
const SLOT: usize = 64;

fn soft() -> Device {
    let bind: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let config = SoftConfig {
        udp: UdpConfig::bound_to(bind),
        progress: ProgressMode::BusyPoll,
        ..SoftConfig::default()
    };
    Device::from(SoftDevice::open(&config).expect("open soft device"))
}

/// Polls `cq` (driving both busy-poll devices) until `want` completions came or 20 s passed.
fn reap(
    tx_cq: &uctel_transport::api::CompletionQueue,
    cq: &uctel_transport::api::CompletionQueue,
    want: usize,
) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = vec![WorkCompletion::default(); 256];
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < want && Instant::now() < deadline {
        let _ = tx_cq.poll(&mut wcs);
        let n = cq.poll(&mut wcs);
        out.extend_from_slice(&wcs[..n]);
        if n == 0 {
            std::thread::yield_now();
        }
    }
    // Anything beyond `want` that is already there.
    std::thread::sleep(Duration::from_millis(20));
    let n = cq.poll(&mut wcs);
    out.extend_from_slice(&wcs[..n]);
    out
}

#[test]
fn sixty_four_uc_qps_complete_into_one_cq_and_take_receive_wrs_from_one_srq() {
    let (tx, rx) = (soft(), soft());
    let (tx_pd, rx_pd) = (tx.alloc_pd().unwrap(), rx.alloc_pd().unwrap());
    let tx_cq = tx.create_cq(4096).unwrap();
    let cq = rx.create_cq(4096).unwrap();
    let srq = rx_pd.create_srq(4096).unwrap();
    // A QP on an SRQ needs no receive queue of its own: max_recv_wr 0 is accepted.
    let attr = |send_cq, recv_cq, access| QpInitAttr {
        qp_type: QpType::Uc,
        send_cq,
        recv_cq,
        max_send_wr: 64,
        max_recv_wr: 0,
        access,
        max_mtu: None,
    };
    let ring = rx_pd
        .reg_mr(
            QPS * FRAMES_PER_QP as usize * SLOT,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let src = tx_pd.reg_mr(SLOT, AccessFlags::LOCAL_WRITE).unwrap();
    let mut pairs: Vec<(QueuePair, QueuePair)> = Vec::new();
    for _ in 0..QPS {
        let r = rx_pd
            .create_qp_with_srq(
                &attr(
                    &cq,
                    &cq,
                    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                ),
                &srq,
            )
            .unwrap();
        let t = tx_pd
            .create_qp(&QpInitAttr {
                max_recv_wr: 1,
                ..attr(&tx_cq, &tx_cq, AccessFlags::LOCAL_WRITE)
            })
            .unwrap();
        t.connect(&r.local_endpoint()).unwrap();
        r.connect(&t.local_endpoint()).unwrap();
        pairs.push((t, r));
    }
    // Receive WRs go to the SRQ, never to a QP on it (ibv_post_recv: EINVAL).
    let refused = pairs[0].1.post_recv(&[RecvWr::zero_length(0)]).unwrap_err();
    assert_eq!(refused.kind, PostRecvErrorKind::OnSrq);
    let total = QPS * FRAMES_PER_QP as usize;
    let wrs: Vec<RecvWr<'_>> = (0..total as u64).map(RecvWr::zero_length).collect();
    srq.post_recv(&wrs).unwrap();
    assert_eq!(srq.posted(), Some(total as u32));

    // No QP's counters changed yet.
    let mut changed = Vec::new();
    assert!(rx.take_changed_qps(&mut changed));
    assert!(changed.is_empty(), "{changed:?}");

    for (i, (t, _)) in pairs.iter().enumerate() {
        let sends: Vec<SendWr<'_>> = (0..FRAMES_PER_QP)
            .map(|k| {
                let off = (i * FRAMES_PER_QP as usize + k as usize) * SLOT;
                SendWr::write_with_imm(
                    u64::from(k),
                    Some(Sge::new(&src, 0, SLOT as u32)),
                    ring.addr() + off as u64,
                    ring.rkey(),
                    (i as u32) << 16 | k,
                )
                .with_signaled(false)
            })
            .collect();
        t.post_send(&sends).unwrap();
    }
    let wcs = reap(&tx_cq, &cq, total);
    assert_eq!(wcs.len(), total);
    let by_qpn: HashMap<u32, usize> = pairs
        .iter()
        .enumerate()
        .map(|(i, (_, r))| (r.qp_num(), i))
        .collect();
    let mut next = vec![0u32; QPS];
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
        // The completion names its QP: the poller finds the connection by it.
        let i = by_qpn[&wc.qp_num];
        let imm = wc.imm.expect("immediate");
        assert_eq!(imm >> 16, i as u32, "QP {:#x}", wc.qp_num);
        assert_eq!(imm & 0xffff, next[i], "in order per QP");
        next[i] += 1;
    }
    assert!(next.iter().all(|&n| n == FRAMES_PER_QP));
    // Every Write-with-immediate took one WR of the SRQ.
    assert_eq!(srq.posted(), Some(0));

    // The SRQ is empty: the next Write-with-immediate on QP 3 is dropped (no receive WR),
    // and only QP 3 is listed as changed.
    pairs[3]
        .0
        .post_send(&[SendWr::write_with_imm(
            0,
            Some(Sge::new(&src, 0, SLOT as u32)),
            ring.addr(),
            ring.rkey(),
            7,
        )
        .with_signaled(false)])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pairs[3].1.stats().drops.get(UcDropReason::NoReceiveWr) == 0 {
        assert!(Instant::now() < deadline, "the drop was never counted");
        let _ = tx_cq.poll(&mut []);
        let _ = cq.poll(&mut []);
    }
    changed.clear();
    assert!(rx.take_changed_qps(&mut changed));
    assert_eq!(changed, vec![pairs[3].1.qp_num()]);
    // Taken: listed again only after a further change.
    changed.clear();
    assert!(rx.take_changed_qps(&mut changed));
    assert!(changed.is_empty());

    // A QP in ERROR flushes no WR of the SRQ: the others still receive with them.
    srq.post_recv(&wrs[..2]).unwrap();
    pairs[0].1.modify_to_error();
    let flushed = reap(&tx_cq, &cq, 0);
    assert!(flushed.is_empty(), "{flushed:?}");
    assert_eq!(srq.posted(), Some(2));
    pairs[1]
        .0
        .post_send(&[SendWr::send(9, Some(Sge::new(&src, 0, 0))).with_signaled(false)])
        .unwrap();
    let got = reap(&tx_cq, &cq, 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].qp_num, got[0].opcode, got[0].status),
        (pairs[1].1.qp_num(), WcOpcode::Recv, WcStatus::Success)
    );
    assert_eq!(srq.posted(), Some(1));
}

#[test]
fn an_srq_refuses_wrs_beyond_its_depth_and_a_foreign_device() {
    let (a, b) = (soft(), soft());
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    assert!(pa.create_srq(0).is_err());
    let srq = pa.create_srq(2).unwrap();
    let wrs: Vec<RecvWr<'_>> = (0..3).map(RecvWr::zero_length).collect();
    let e = srq.post_recv(&wrs).unwrap_err();
    assert_eq!(
        (e.posted, e.kind),
        (2, PostRecvErrorKind::Full { depth: 2 })
    );
    let cq = b.create_cq(16).unwrap();
    let attr = QpInitAttr {
        qp_type: QpType::Uc,
        send_cq: &cq,
        recv_cq: &cq,
        max_send_wr: 4,
        max_recv_wr: 0,
        access: AccessFlags::REMOTE_WRITE,
        max_mtu: None,
    };
    assert!(pb.create_qp_with_srq(&attr, &srq).is_err());
}
