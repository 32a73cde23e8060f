//! The soft transport end to end over real UDP on 127.0.0.1: 100,000 one-packet RDMA
//! WRITE_WITH_IMM frames of 1 KiB into a registered ring (slot = seq mod slots) with 5 %
//! seeded loss injected on the sender's link.
//!
//! The sender keeps a bounded window of frames in flight (frames sent minus frames the
//! receiver accounted for), so the kernel's socket buffers never overflow and the receive
//! queue never runs empty; the only losses are then the injected ones, and the test checks
//! exactly: `completions + counted drops == sent - injected`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uctel_transport::api::{
    AccessFlags, Device, QpInitAttr, QpState, QpType, RecvWr, SendWr, Sge, UcDropReason, WcOpcode,
    WcStatus, WorkCompletion,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::fault::FaultConfig;
use uctel_transport::soft::udp::UdpConfig;

const FRAMES: u64 = 100_000;
const FRAME: usize = 1024;
const SLOTS: u64 = 512;
const WINDOW: u64 = 256;
const POST_BATCH: u64 = 32;
const DEADLINE: Duration = Duration::from_secs(120);

fn soft(faults: Option<FaultConfig>) -> SoftDevice {
    let bind: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let config = SoftConfig {
        udp: UdpConfig::bound_to(bind),
        progress: ProgressMode::BusyPoll,
        faults,
        ..SoftConfig::default()
    };
    SoftDevice::open(&config).expect("open soft device")
}

fn frame(seq: u64) -> [u8; FRAME] {
    let mut f = [0u8; FRAME];
    f[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in f[8..].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_add(i as u8);
    }
    f
}

#[test]
fn hundred_thousand_write_with_imm_frames_with_five_percent_loss_add_up() {
    let faults = FaultConfig {
        drop_ratio: 0.05,
        seed: 0x5eed_0001,
        ..FaultConfig::default()
    };
    let tx_soft = soft(Some(faults));
    let rx_soft = soft(None);
    let fault_stats = tx_soft.fault_stats().expect("fault injector installed");
    let tx = Device::from(tx_soft.clone());
    let rx = Device::from(rx_soft.clone());

    let (tx_pd, rx_pd) = (tx.alloc_pd().unwrap(), rx.alloc_pd().unwrap());
    let (tx_cq, rx_cq) = (tx.create_cq(1024).unwrap(), rx.create_cq(2048).unwrap());
    let tx_qp = tx_pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: &tx_cq,
            recv_cq: &tx_cq,
            max_send_wr: 512,
            max_recv_wr: 1,
            access: AccessFlags::LOCAL_WRITE,
            max_mtu: None,
        })
        .unwrap();
    let rx_qp = rx_pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Uc,
            send_cq: &rx_cq,
            recv_cq: &rx_cq,
            max_send_wr: 1,
            max_recv_wr: 1024,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            max_mtu: None,
        })
        .unwrap();
    let ring = rx_pd
        .reg_mr(
            (SLOTS as usize) * FRAME,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let src = tx_pd
        .reg_mr((SLOTS as usize) * FRAME, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let zero_wrs: Vec<RecvWr<'_>> = (0..1024).map(RecvWr::zero_length).collect();
    rx_qp.post_recv(&zero_wrs).unwrap();
    tx_qp.connect(&rx_qp.local_endpoint()).unwrap();
    rx_qp.connect(&tx_qp.local_endpoint()).unwrap();

    let start = Instant::now();
    let mut sent = 0u64;
    let mut completed = 0u64;
    let mut last_seq: Option<u64> = None;
    let mut wcs = vec![WorkCompletion::default(); 256];
    let mut slot_buf = [0u8; FRAME];
    let accounted = |completed: u64| {
        let qp = rx_qp.stats();
        let dev = rx.stats();
        completed + qp.drops.total() + dev.drops.total() + fault_stats.snapshot().dropped
    };
    loop {
        // Post a batch while the window allows.
        let in_flight = sent - accounted(completed);
        let room = WINDOW
            .saturating_sub(in_flight)
            .min(POST_BATCH)
            .min(FRAMES - sent);
        if room > 0 {
            for seq in sent..sent + room {
                src.write_at(((seq % SLOTS) as usize) * FRAME, &frame(seq))
                    .unwrap();
            }
            let wrs: Vec<SendWr<'_>> = (sent..sent + room)
                .map(|seq| {
                    let off = ((seq % SLOTS) as usize) * FRAME;
                    SendWr::write_with_imm(
                        seq,
                        Some(Sge::new(&src, off, FRAME as u32)),
                        ring.addr() + off as u64,
                        ring.rkey(),
                        seq as u32,
                    )
                    .with_signaled(false)
                })
                .collect();
            tx_qp
                .post_send(&wrs)
                .expect("post_send within the window never fills the SQ");
            sent += room;
        }
        // Drive the sender (flushes its transmit queue) and reap the receiver.
        let _ = tx_cq.poll(&mut []);
        let n = rx_cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
            assert_eq!(wc.byte_len, FRAME as u32);
            let seq = u64::from(wc.imm.expect("immediate"));
            assert!(
                last_seq.is_none_or(|l| seq > l),
                "in order: {seq} after {last_seq:?}"
            );
            last_seq = Some(seq);
            ring.read_at(((seq % SLOTS) as usize) * FRAME, &mut slot_buf)
                .unwrap();
            assert!(slot_buf == frame(seq), "slot content of frame {seq}");
        }
        if n > 0 {
            completed += n as u64;
            rx_qp
                .post_recv(&zero_wrs[..n])
                .expect("receive queue refilled");
        }
        if sent == FRAMES && accounted(completed) == sent {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "stuck: sent {sent}, accounted {}",
            accounted(completed)
        );
        if n == 0 && room == 0 {
            std::thread::yield_now();
        }
    }
    let elapsed = start.elapsed();

    let injected = fault_stats.snapshot();
    let qp = rx_qp.stats();
    let dev = rx.stats();
    let counted = qp.drops.total() + dev.drops.total();
    eprintln!(
        "{FRAMES} frames in {elapsed:?}: {completed} completed, {} injected drops, {counted} counted drops, {} PSN resyncs",
        injected.dropped, qp.psn_resyncs
    );
    assert_eq!(completed + counted, sent - injected.dropped);
    // The injected drops are the only losses: nothing else was dropped anywhere.
    assert_eq!(counted, 0, "qp {:?} device {:?}", qp.drops, dev.drops);
    assert_eq!(dev.packets_received, sent - injected.dropped);
    assert_eq!(qp.messages_completed, completed);
    assert_eq!(tx_qp.stats().packets_sent, FRAMES);
    // 5 % of 100,000 (binomial, sd ≈ 69): a generous band around the expectation.
    assert!((4_500..=5_500).contains(&injected.dropped), "{injected:?}");
    assert!(qp.psn_resyncs > 0 && qp.psn_resyncs <= injected.dropped);
    assert_eq!(qp.drops.get(UcDropReason::NoReceiveWr), 0);
    assert_eq!(rx_qp.state(), QpState::Rts);
    assert_eq!(tx_soft.link_errors() + rx_soft.link_errors(), 0);
}
