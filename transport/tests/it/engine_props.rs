//! Property tests of the UC engine.
//!
//! 1. Loss: for any MTU, start PSN (including next to the 2^24 wrap), sequence of SEND /
//!    WRITE / WRITE_WITH_IMM messages and per-packet loss pattern (in-order delivery), a message
//!    completes at the responder exactly when all of its packets arrived, with the right bytes
//!    and immediate; every other message leaves no completion.
//! 2. Robustness: any sequence of well-formed but arbitrary UC packets never panics, and the
//!    outcomes agree with the counters.

use proptest::prelude::*;

use uctel_transport::api::{AccessFlags, Mtu, SendOpcode, UcDropReason, WcOpcode, WcStatus};
use uctel_transport::soft::engine::{
    LocalSge, RecvWqe, RtrAttr, RxOutcome, SendWqe, UcQp, UcQpConfig, VecCq,
};
use uctel_transport::soft::memory::MrTable;
use uctel_transport::soft::packet::{BthRepr, Opcode, PacketRepr, RethRepr, DEFAULT_PKEY};
use uctel_transport::soft::psn::Psn;

fn rw_remote() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
}

fn mtu_strategy() -> impl Strategy<Value = Mtu> {
    prop_oneof![
        Just(Mtu::Mtu256),
        Just(Mtu::Mtu512),
        Just(Mtu::Mtu1024),
        Just(Mtu::Mtu4096)
    ]
}

fn psn_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..0x00ff_ffff, 0x00ff_fff0u32..=0x00ff_ffff]
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send,
    Write,
    WriteImm,
}

fn kind_strategy() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Send), Just(Kind::Write), Just(Kind::WriteImm)]
}

const SLOT: usize = 3 * 4096;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_message_completes_exactly_when_all_its_packets_arrive(
        mtu in mtu_strategy(),
        psn in psn_strategy(),
        msgs in prop::collection::vec((kind_strategy(), 0usize..=3 * 4096), 1..12),
        loss_seed in any::<u64>(),
        loss_per_mille in 0u64..400,
    ) {
        let m = mtu.bytes() as usize;
        let a_mem = MrTable::new();
        let b_mem = MrTable::new();
        let mut a = UcQp::new(UcQpConfig { qpn: 1, max_send_wr: 64, max_recv_wr: 1 });
        let mut b = UcQp::new(UcQpConfig { qpn: 2, max_send_wr: 1, max_recv_wr: 64 });
        a.modify_to_init(AccessFlags::LOCAL_WRITE).unwrap();
        b.modify_to_init(rw_remote()).unwrap();
        a.modify_to_rtr(RtrAttr { dest_qpn: 2, rq_psn: 0, path_mtu: mtu }).unwrap();
        a.modify_to_rts(psn).unwrap();
        b.modify_to_rtr(RtrAttr { dest_qpn: 1, rq_psn: psn, path_mtu: mtu }).unwrap();
        let ring = b_mem.register(msgs.len() * SLOT, rw_remote()).unwrap();
        let recv = b_mem.register(msgs.len() * SLOT, AccessFlags::LOCAL_WRITE).unwrap();
        let src = a_mem.register(msgs.len() * SLOT, AccessFlags::LOCAL_WRITE).unwrap();
        for i in 0..msgs.len() {
            b.post_recv(RecvWqe {
                wr_id: i as u64,
                sge: Some(LocalSge { lkey: recv.key(), offset: i * SLOT, length: SLOT as u32 }),
            }).unwrap();
        }
        // Post every message; remember which packets belong to which message.
        let mut owner = Vec::new();
        let mut scq = VecCq::new(1024);
        let mut packets = Vec::new();
        for (i, (kind, len)) in msgs.iter().enumerate() {
            let data: Vec<u8> = (0..*len).map(|j| (j as u8) ^ (i as u8).wrapping_mul(31)).collect();
            src.write_at(i * SLOT, &data).unwrap();
            let va = ring.addr() + (i * SLOT) as u64;
            let opcode = match kind {
                Kind::Send => SendOpcode::SendWithImm { imm: i as u32 },
                Kind::Write => SendOpcode::RdmaWrite { remote_addr: va, rkey: ring.key() },
                Kind::WriteImm => SendOpcode::RdmaWriteWithImm { remote_addr: va, rkey: ring.key(), imm: i as u32 },
            };
            let sge = (*len > 0).then_some(LocalSge { lkey: src.key(), offset: i * SLOT, length: *len as u32 });
            a.post_send(SendWqe { wr_id: i as u64, opcode, sge, signaled: false }).unwrap();
            for _ in 0..len.div_ceil(m).max(1) {
                let mut buf = Vec::new();
                a.poll_transmit(&a_mem, &mut buf, &mut scq).expect("packet");
                packets.push(buf);
                owner.push(i);
            }
        }
        prop_assert!(a.poll_transmit(&a_mem, &mut Vec::new(), &mut scq).is_none());
        // Deterministic pseudo-random loss.
        let mut x = loss_seed | 1;
        let mut lost = vec![false; packets.len()];
        for l in lost.iter_mut() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            *l = x % 1000 < loss_per_mille;
        }
        let mut rcq = VecCq::new(1024);
        for (p, l) in packets.iter().zip(&lost) {
            if !l {
                let repr = PacketRepr::parse(p).unwrap();
                b.receive(&repr, &b_mem, &mut rcq);
            }
        }
        let intact: Vec<bool> = (0..msgs.len())
            .map(|i| owner.iter().zip(&lost).all(|(o, l)| *o != i || !l))
            .collect();
        // Completions (SEND and WRITE_WITH_IMM produce one each), in order.
        let wcs: Vec<_> = std::iter::from_fn(|| rcq.pop()).collect();
        let want: Vec<usize> = (0..msgs.len())
            .filter(|i| intact[*i] && !matches!(msgs[*i].0, Kind::Write))
            .collect();
        let got: Vec<usize> = wcs.iter().map(|w| w.imm.expect("imm") as usize).collect();
        prop_assert_eq!(&got, &want);
        for (recv_wr, wc) in wcs.iter().enumerate() {
            let recv_wr = recv_wr as u64;
            let i = wc.imm.unwrap() as usize;
            prop_assert_eq!(wc.status, WcStatus::Success);
            prop_assert_eq!(wc.byte_len as usize, msgs[i].1);
            let data: Vec<u8> = (0..msgs[i].1).map(|j| (j as u8) ^ (i as u8).wrapping_mul(31)).collect();
            let mut got = vec![0u8; msgs[i].1];
            match msgs[i].0 {
                Kind::Send => {
                    prop_assert_eq!(wc.opcode, WcOpcode::Recv);
                    // Receive WRs are consumed in order; dropped messages consumed none.
                    recv.read_at(recv_wr as usize * SLOT, &mut got).unwrap();
                }
                _ => {
                    prop_assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                    ring.read_at(i * SLOT, &mut got).unwrap();
                }
            }
            prop_assert_eq!(wc.wr_id, recv_wr);
            prop_assert_eq!(got, data);
        }
        // Plain WRITEs that arrived whole are in the ring.
        for (i, (kind, len)) in msgs.iter().enumerate() {
            if matches!(kind, Kind::Write) && intact[i] {
                let data: Vec<u8> = (0..*len).map(|j| (j as u8) ^ (i as u8).wrapping_mul(31)).collect();
                let mut got = vec![0u8; *len];
                ring.read_at(i * SLOT, &mut got).unwrap();
                prop_assert_eq!(got, data);
            }
        }
        let s = b.stats();
        prop_assert_eq!(s.messages_completed as usize, intact.iter().filter(|x| **x).count());
        // Only loss-related reasons can appear.
        for r in UcDropReason::ALL {
            if !matches!(r, UcDropReason::PsnGap | UcDropReason::CutShort) {
                prop_assert_eq!(s.drops.get(r), 0, "{}", r);
            }
        }
    }

    #[test]
    fn arbitrary_packets_never_panic_and_outcomes_match_counters(
        pkts in prop::collection::vec(
            (0u8..12, 0u32..8, any::<bool>(), 0u64..0x3000, any::<u32>(), 0usize..600, any::<bool>()),
            1..60,
        ),
        recv_wrs in 0usize..8,
        cq_depth in 1usize..8,
    ) {
        let mem = MrTable::new();
        let ring = mem.register(0x2000, rw_remote()).unwrap();
        let buf = mem.register(512, AccessFlags::LOCAL_WRITE).unwrap();
        let mut q = UcQp::new(UcQpConfig { qpn: 9, max_send_wr: 1, max_recv_wr: 8 });
        q.modify_to_init(rw_remote()).unwrap();
        q.modify_to_rtr(RtrAttr { dest_qpn: 1, rq_psn: 0, path_mtu: Mtu::Mtu256 }).unwrap();
        for i in 0..recv_wrs {
            let sge = (i % 2 == 0).then_some(LocalSge { lkey: buf.key(), offset: 0, length: 512 });
            q.post_recv(RecvWqe { wr_id: i as u64, sge }).unwrap();
        }
        let mut rcq = VecCq::new(cq_depth);
        let mut outcomes = Vec::new();
        for (op, psn, good_key, va_off, imm, len, big_dma) in pkts {
            let opcode = Opcode::ALL[usize::from(op)];
            let reth = opcode.has_reth().then_some(RethRepr {
                virtual_addr: ring.addr().wrapping_add(va_off),
                rkey: if good_key { ring.key() } else { ring.key() ^ 0x100 },
                dma_len: if big_dma { 0x9000_0000 } else { len as u32 + (va_off as u32 % 700) },
            });
            let bth = BthRepr {
                opcode,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qpn: 9,
                ack_req: false,
                psn: Psn::new(psn),
            };
            let payload = vec![0xabu8; len];
            let imm = opcode.has_immdt().then_some(imm);
            let mut out = Vec::new();
            PacketRepr { bth, reth, imm, payload: &payload }.emit(&mut out).unwrap();
            let repr = PacketRepr::parse(&out).unwrap();
            outcomes.push(q.receive(&repr, &mem, &mut rcq));
        }
        let s = q.stats();
        prop_assert_eq!(s.packets_received as usize, outcomes.len());
        let count = |f: &dyn Fn(&RxOutcome) -> bool| outcomes.iter().filter(|o| f(o)).count() as u64;
        prop_assert_eq!(count(&|o| *o == RxOutcome::Discarded), s.packets_discarded);
        prop_assert_eq!(count(&|o| *o == RxOutcome::Completed), s.messages_completed);
        for r in UcDropReason::ALL {
            if r != UcDropReason::CutShort {
                prop_assert_eq!(count(&|o| *o == RxOutcome::Dropped(r)), s.drops.get(r), "{}", r);
            }
        }
        prop_assert!(rcq.wcs.len() <= cq_depth);
    }
}
