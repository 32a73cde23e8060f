//! Sans-IO UC engine tests: two `UcQp`s wired back to back through a packet vector, with
//! loss decided per packet by the test. Every drive loop is bounded; every test asserts the
//! drop counters by reason.

use uctel_transport::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, QpStats, SendOpcode, UcDropReason, WcOpcode, WcStatus,
};
use uctel_transport::soft::engine::{
    CompletionSink, LocalSge, PostRefusal, RecvRefusal, RecvWqe, RtrAttr, RxOutcome, SendWqe, UcQp,
    UcQpConfig, VecCq,
};
use uctel_transport::soft::memory::{MrTable, SoftMr};
use uctel_transport::soft::packet::{BthRepr, Opcode, PacketRepr, RethRepr, DEFAULT_PKEY};
use uctel_transport::soft::psn::Psn;

use std::sync::Arc;

/// Upper bound on packets pulled per drive loop; a runaway requester fails the test.
const MAX_PACKETS: usize = 10_000;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE;

fn rw_remote() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
}

struct Side {
    qp: UcQp,
    mem: MrTable,
    scq: VecCq,
    rcq: VecCq,
}

impl Side {
    fn new(qpn: u32, depth: u32, access: AccessFlags) -> Self {
        let mut qp = UcQp::new(UcQpConfig {
            qpn,
            max_send_wr: depth,
            max_recv_wr: depth,
        });
        qp.modify_to_init(access).expect("init");
        Side {
            qp,
            mem: MrTable::new(),
            scq: VecCq::new(1024),
            rcq: VecCq::new(1024),
        }
    }

    fn reg(&self, len: usize, access: AccessFlags) -> Arc<SoftMr> {
        self.mem.register(len, access).expect("reg_mr")
    }

    fn post_recv(&mut self, wr_id: u64, buf: Option<(&SoftMr, usize, u32)>) {
        let sge = buf.map(|(mr, offset, length)| LocalSge {
            lkey: mr.key(),
            offset,
            length,
        });
        self.qp
            .post_recv(RecvWqe { wr_id, sge })
            .expect("post_recv");
    }
}

/// Requester `a` → responder `b`.
struct Pair {
    a: Side,
    b: Side,
}

impl Pair {
    fn new(mtu: Mtu, a_psn: u32) -> Pair {
        Self::with_access(mtu, a_psn, rw_remote())
    }

    fn with_access(mtu: Mtu, a_psn: u32, b_access: AccessFlags) -> Pair {
        let mut a = Side::new(0x11, 64, RW);
        let mut b = Side::new(0x22, 64, b_access);
        a.qp.modify_to_rtr(RtrAttr {
            dest_qpn: 0x22,
            rq_psn: 0,
            path_mtu: mtu,
        })
        .expect("rtr");
        a.qp.modify_to_rts(a_psn).expect("rts");
        b.qp.modify_to_rtr(RtrAttr {
            dest_qpn: 0x11,
            rq_psn: a_psn,
            path_mtu: mtu,
        })
        .expect("rtr");
        b.qp.modify_to_rts(0).expect("rts");
        Pair { a, b }
    }

    /// Posts a send WR at `a` whose data is `data` (copied into a fresh MR).
    fn post(&mut self, wr_id: u64, opcode: SendOpcode, data: &[u8]) {
        let sge = if data.is_empty() {
            None
        } else {
            let mr = self.a.reg(data.len(), RW);
            mr.write_at(0, data).expect("write_at");
            // Keep the MR alive in the table: the table holds it until deregistered.
            Some(LocalSge {
                lkey: mr.key(),
                offset: 0,
                length: data.len() as u32,
            })
        };
        self.a
            .qp
            .post_send(SendWqe {
                wr_id,
                opcode,
                sge,
                signaled: true,
            })
            .expect("post_send");
    }

    /// Pulls every packet `a` has to send.
    fn transmit(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..MAX_PACKETS {
            let mut buf = Vec::new();
            match self
                .a
                .qp
                .poll_transmit(&self.a.mem, &mut buf, &mut self.a.scq)
            {
                Some(_) => out.push(buf),
                None => return out,
            }
        }
        panic!("requester produced more than {MAX_PACKETS} packets");
    }

    fn deliver(&mut self, pkt: &[u8]) -> RxOutcome {
        let repr = PacketRepr::parse(pkt).expect("parse");
        self.b.qp.receive(&repr, &self.b.mem, &mut self.b.rcq)
    }

    /// Sends everything pending at `a`, delivering packet `i` unless `lose(i)`.
    fn run(&mut self, lose: impl Fn(usize) -> bool) -> Vec<RxOutcome> {
        let pkts = self.transmit();
        let mut outcomes = Vec::new();
        for (i, p) in pkts.iter().enumerate() {
            if !lose(i) {
                outcomes.push(self.deliver(p));
            }
        }
        outcomes
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn opcodes(pkts: &[Vec<u8>]) -> Vec<Opcode> {
    pkts.iter()
        .map(|p| PacketRepr::parse(p).expect("parse").bth.opcode)
        .collect()
}

/// Asserts exactly these drop counts; every other reason must be zero.
fn assert_drops(stats: &QpStats, expected: &[(UcDropReason, u64)]) {
    for r in UcDropReason::ALL {
        let want = expected
            .iter()
            .find(|(e, _)| *e == r)
            .map_or(0, |(_, n)| *n);
        assert_eq!(
            stats.drops.get(r),
            want,
            "drop counter {r}: {:?}",
            stats.drops
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Segmentation
// ---------------------------------------------------------------------------------------------

#[test]
fn send_3000_bytes_at_mtu_1024_is_three_packets_and_arrives_whole() {
    let mut p = Pair::new(Mtu::Mtu1024, 100);
    let data = pattern(3000, 1);
    p.post(7, SendOpcode::SendWithImm { imm: 0x1122_3344 }, &data);
    let buf = p.b.reg(4096, RW);
    p.b.post_recv(70, Some((&buf, 0, 4096)));

    let pkts = p.a.transmit_checked();
    assert_eq!(
        opcodes(&pkts),
        [
            Opcode::SendFirst,
            Opcode::SendMiddle,
            Opcode::SendLastWithImmediate
        ]
    );
    let lens: Vec<usize> = pkts
        .iter()
        .map(|x| PacketRepr::parse(x).unwrap().payload.len())
        .collect();
    assert_eq!(lens, [1024, 1024, 952]);
    let psns: Vec<u32> = pkts
        .iter()
        .map(|x| PacketRepr::parse(x).unwrap().bth.psn.value())
        .collect();
    assert_eq!(psns, [100, 101, 102]);
    let send_wc = p.a.scq.pop().expect("send completion");
    assert_eq!(
        (send_wc.wr_id, send_wc.opcode, send_wc.byte_len),
        (7, WcOpcode::Send, 3000)
    );

    let outcomes: Vec<RxOutcome> = pkts.iter().map(|x| p.deliver(x)).collect();
    assert_eq!(
        outcomes,
        [
            RxOutcome::Accepted,
            RxOutcome::Accepted,
            RxOutcome::Completed
        ]
    );
    let wc = p.b.rcq.pop().expect("recv completion");
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm),
        (70, WcOpcode::Recv, 3000, Some(0x1122_3344))
    );
    assert_eq!(wc.qp_num, 0x22);
    let mut got = vec![0u8; 3000];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(got, data);
    let s = p.b.qp.stats();
    assert_eq!(
        (s.packets_received, s.messages_completed, s.psn_resyncs),
        (3, 1, 0)
    );
    assert_drops(&s, &[]);
}

impl Side {
    /// Pulls every packet this side has to send (bounded).
    fn transmit_checked(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..MAX_PACKETS {
            let mut buf = Vec::new();
            match self.qp.poll_transmit(&self.mem, &mut buf, &mut self.scq) {
                Some(_) => out.push(buf),
                None => return out,
            }
        }
        panic!("requester produced more than {MAX_PACKETS} packets");
    }
}

#[test]
fn write_with_imm_3000_bytes_places_data_and_uses_a_zero_length_wr() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    let ring = p.b.reg(8192, rw_remote());
    let data = pattern(3000, 9);
    p.post(
        1,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: ring.addr() + 4096,
            rkey: ring.key(),
            imm: 0xdead_beef,
        },
        &data,
    );
    p.b.post_recv(11, None);
    let pkts = p.transmit();
    assert_eq!(
        opcodes(&pkts),
        [
            Opcode::RdmaWriteFirst,
            Opcode::RdmaWriteMiddle,
            Opcode::RdmaWriteLastWithImmediate
        ]
    );
    let first = PacketRepr::parse(&pkts[0]).unwrap();
    assert_eq!(
        first.reth,
        Some(RethRepr {
            virtual_addr: ring.addr() + 4096,
            rkey: ring.key(),
            dma_len: 3000
        })
    );
    assert!(PacketRepr::parse(&pkts[1]).unwrap().reth.is_none());
    assert_eq!(PacketRepr::parse(&pkts[2]).unwrap().imm, Some(0xdead_beef));
    for x in &pkts {
        p.deliver(x);
    }
    let wc = p.b.rcq.pop().expect("completion");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm),
        (
            11,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            3000,
            Some(0xdead_beef)
        )
    );
    let mut got = vec![0u8; 3000];
    ring.read_at(4096, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(p.a.scq.pop().map(|w| w.opcode), Some(WcOpcode::RdmaWrite));
    assert_drops(&p.b.qp.stats(), &[]);
}

#[test]
fn segmentation_at_every_mtu_and_around_boundaries() {
    for mtu in [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ] {
        let m = mtu.bytes() as usize;
        for len in [0, 1, m - 1, m, m + 1, 2 * m, 2 * m + 3, 5 * m - 1] {
            let mut p = Pair::new(mtu, 0);
            let ring = p.b.reg(5 * m + 8, rw_remote());
            let data = pattern(len, len as u8);
            p.post(
                1,
                SendOpcode::RdmaWrite {
                    remote_addr: ring.addr(),
                    rkey: ring.key(),
                },
                &data,
            );
            let pkts = p.transmit();
            let expect_pkts = len.div_ceil(m).max(1);
            assert_eq!(pkts.len(), expect_pkts, "mtu {m} len {len}");
            let ops = opcodes(&pkts);
            if expect_pkts == 1 {
                assert_eq!(ops, [Opcode::RdmaWriteOnly]);
            } else {
                assert_eq!(ops[0], Opcode::RdmaWriteFirst);
                assert!(ops[1..expect_pkts - 1]
                    .iter()
                    .all(|o| *o == Opcode::RdmaWriteMiddle));
                assert_eq!(ops[expect_pkts - 1], Opcode::RdmaWriteLast);
            }
            let total: usize = pkts
                .iter()
                .map(|x| PacketRepr::parse(x).unwrap().payload.len())
                .sum();
            assert_eq!(total, len);
            for x in &pkts {
                assert_eq!(x.len() % 4, 0, "padded to 4 bytes");
                let out = p.deliver(x);
                assert!(
                    matches!(out, RxOutcome::Accepted | RxOutcome::Completed),
                    "{out:?}"
                );
            }
            let mut got = vec![0u8; len];
            ring.read_at(0, &mut got).unwrap();
            assert_eq!(got, data, "mtu {m} len {len}");
            assert_eq!(p.b.qp.stats().messages_completed, 1);
            assert_drops(&p.b.qp.stats(), &[]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// PSN wrap
// ---------------------------------------------------------------------------------------------

#[test]
fn psn_wraps_at_2_pow_24_without_loss_or_resync() {
    let mut p = Pair::new(Mtu::Mtu256, 0xff_fffd);
    let ring = p.b.reg(4096, rw_remote());
    // Three one-packet messages, then a three-packet one straddling the wrap, then one more.
    for i in 0..3u32 {
        p.post(
            u64::from(i),
            SendOpcode::RdmaWriteWithImm {
                remote_addr: ring.addr(),
                rkey: ring.key(),
                imm: i,
            },
            &[i as u8; 16],
        );
    }
    p.post(
        3,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: ring.addr(),
            rkey: ring.key(),
            imm: 3,
        },
        &pattern(600, 3),
    );
    p.post(
        4,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: ring.addr(),
            rkey: ring.key(),
            imm: 4,
        },
        &[4; 8],
    );
    for i in 0..5 {
        p.b.post_recv(100 + i, None);
    }
    let pkts = p.transmit();
    let psns: Vec<u32> = pkts
        .iter()
        .map(|x| PacketRepr::parse(x).unwrap().bth.psn.value())
        .collect();
    assert_eq!(psns, [0xff_fffd, 0xff_fffe, 0xff_ffff, 0, 1, 2, 3]);
    for x in &pkts {
        p.deliver(x);
    }
    let imms: Vec<Option<u32>> = std::iter::from_fn(|| p.b.rcq.pop())
        .map(|w| w.imm)
        .collect();
    assert_eq!(imms, [Some(0), Some(1), Some(2), Some(3), Some(4)]);
    let s = p.b.qp.stats();
    assert_eq!((s.messages_completed, s.psn_resyncs), (5, 0));
    assert_eq!(p.b.qp.expected_psn(), 4);
    assert_eq!(p.a.qp.sq_psn(), 4);
    assert_drops(&s, &[]);
}

// ---------------------------------------------------------------------------------------------
// Loss inside multi-packet messages
// ---------------------------------------------------------------------------------------------

/// A three-packet message (packets 0..3) followed by a one-packet message (packet 3); packet
/// `lost` never arrives. Returns the pair for inspection.
fn three_then_one(send: bool, lost: usize) -> (Pair, Arc<SoftMr>) {
    let mut p = Pair::new(Mtu::Mtu256, 500);
    let ring = p.b.reg(4096, rw_remote());
    let big = pattern(700, 1);
    let small = pattern(40, 2);
    if send {
        p.post(1, SendOpcode::SendWithImm { imm: 1 }, &big);
        p.post(2, SendOpcode::SendWithImm { imm: 2 }, &small);
        p.b.post_recv(10, Some((&ring, 0, 1024)));
        p.b.post_recv(20, Some((&ring, 1024, 1024)));
    } else {
        p.post(
            1,
            SendOpcode::RdmaWriteWithImm {
                remote_addr: ring.addr(),
                rkey: ring.key(),
                imm: 1,
            },
            &big,
        );
        p.post(
            2,
            SendOpcode::RdmaWriteWithImm {
                remote_addr: ring.addr() + 1024,
                rkey: ring.key(),
                imm: 2,
            },
            &small,
        );
        p.b.post_recv(10, None);
        p.b.post_recv(20, None);
    }
    p.run(|i| i == lost);
    (p, ring)
}

#[test]
fn losing_the_first_packet_drops_exactly_that_message() {
    for send in [true, false] {
        let (mut p, _) = three_then_one(send, 0);
        let wc = p.b.rcq.pop().expect("second message arrives");
        assert_eq!(
            (wc.imm, wc.byte_len, wc.status),
            (Some(2), 40, WcStatus::Success)
        );
        assert_eq!(wc.wr_id, 10, "the dropped message consumed no receive WR");
        assert!(p.b.rcq.pop().is_none());
        let s = p.b.qp.stats();
        // MIDDLE arrives with a PSN gap (message counted once), LAST is discarded with it.
        assert_eq!(
            (s.packets_discarded, s.messages_completed, s.psn_resyncs),
            (1, 1, 0)
        );
        assert_drops(&s, &[(UcDropReason::PsnGap, 1)]);
    }
}

#[test]
fn losing_a_middle_packet_drops_exactly_that_message() {
    for send in [true, false] {
        let (mut p, _) = three_then_one(send, 1);
        let wc = p.b.rcq.pop().expect("second message arrives");
        assert_eq!((wc.imm, wc.byte_len), (Some(2), 40));
        assert_eq!(
            wc.wr_id, 10,
            "the receive WR of the dropped message is reused"
        );
        assert!(p.b.rcq.pop().is_none());
        let s = p.b.qp.stats();
        assert_eq!(
            (s.packets_discarded, s.messages_completed, s.psn_resyncs),
            (0, 1, 0)
        );
        assert_drops(&s, &[(UcDropReason::PsnGap, 1)]);
        assert_eq!(p.b.qp.rq_len(), 1);
    }
}

#[test]
fn losing_the_last_packet_drops_exactly_that_message_and_the_next_resyncs() {
    for send in [true, false] {
        let (mut p, ring) = three_then_one(send, 2);
        let wc = p.b.rcq.pop().expect("second message arrives");
        assert_eq!((wc.imm, wc.byte_len), (Some(2), 40));
        assert_eq!(
            wc.wr_id, 10,
            "the receive WR of the cut-short message is reused"
        );
        assert!(p.b.rcq.pop().is_none());
        let mut got = vec![0u8; 40];
        ring.read_at(if send { 0 } else { 1024 }, &mut got).unwrap();
        assert_eq!(got, pattern(40, 2));
        let s = p.b.qp.stats();
        assert_eq!(
            (s.packets_discarded, s.messages_completed, s.psn_resyncs),
            (0, 1, 1)
        );
        assert_drops(&s, &[(UcDropReason::CutShort, 1)]);
    }
}

#[test]
fn lost_one_packet_messages_resync_on_the_next_only_packet() {
    let mut p = Pair::new(Mtu::Mtu1024, 0x00ff_fff0);
    let ring = p.b.reg(64 * 1024, rw_remote());
    for i in 0..40u32 {
        let va = ring.addr() + u64::from(i % 64) * 1024;
        p.post(
            u64::from(i),
            SendOpcode::RdmaWriteWithImm {
                remote_addr: va,
                rkey: ring.key(),
                imm: i,
            },
            &[i as u8; 1024],
        );
        p.b.post_recv(u64::from(i), None);
    }
    let lost = |i: usize| i % 7 == 3 || i == 39;
    p.run(lost);
    let got: Vec<u32> = std::iter::from_fn(|| p.b.rcq.pop())
        .filter_map(|w| w.imm)
        .collect();
    let want: Vec<u32> = (0..40u32).filter(|i| !lost(*i as usize)).collect();
    assert_eq!(got, want);
    let s = p.b.qp.stats();
    // Each run of lost packets followed by an arriving one is one resync; the last loss is
    // never noticed (nothing arrives after it).
    assert_eq!(s.psn_resyncs, 5);
    assert_drops(&s, &[]);
}

// ---------------------------------------------------------------------------------------------
// Receive WRs
// ---------------------------------------------------------------------------------------------

#[test]
fn send_and_write_with_imm_without_receive_wr_are_dropped_silently() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    let ring = p.b.reg(4096, rw_remote());
    p.post(1, SendOpcode::Send, &[1; 100]);
    p.post(
        2,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: ring.addr(),
            rkey: ring.key(),
            imm: 2,
        },
        &[2; 100],
    );
    // A plain WRITE needs no receive WR and produces no completion.
    p.post(
        3,
        SendOpcode::RdmaWrite {
            remote_addr: ring.addr() + 200,
            rkey: ring.key(),
        },
        &[3; 100],
    );
    let out = p.run(|_| false);
    assert_eq!(
        out,
        [
            RxOutcome::Dropped(UcDropReason::NoReceiveWr),
            RxOutcome::Dropped(UcDropReason::NoReceiveWr),
            RxOutcome::Completed
        ]
    );
    assert!(p.b.rcq.pop().is_none());
    let mut got = [0u8; 100];
    ring.read_at(200, &mut got).unwrap();
    assert_eq!(got, [3; 100]);
    // Once a WR is posted, the next message arrives with its own immediate.
    p.b.post_recv(9, None);
    p.post(
        4,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: ring.addr(),
            rkey: ring.key(),
            imm: 4,
        },
        &[4; 100],
    );
    p.run(|_| false);
    let wc = p.b.rcq.pop().expect("completion");
    assert_eq!((wc.wr_id, wc.imm), (9, Some(4)));
    assert_drops(&p.b.qp.stats(), &[(UcDropReason::NoReceiveWr, 2)]);
}

#[test]
fn multi_packet_send_without_receive_wr_counts_one_drop() {
    let mut p = Pair::new(Mtu::Mtu256, 0);
    p.post(1, SendOpcode::Send, &pattern(1000, 0));
    let out = p.run(|_| false);
    assert_eq!(out[0], RxOutcome::Dropped(UcDropReason::NoReceiveWr));
    assert!(out[1..].iter().all(|o| *o == RxOutcome::Discarded));
    let s = p.b.qp.stats();
    assert_eq!(s.packets_discarded, 3);
    assert_drops(&s, &[(UcDropReason::NoReceiveWr, 1)]);
}

#[test]
fn send_longer_than_the_receive_buffer_fails_the_qp_as_rxe_does() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    let buf = p.b.reg(4096, RW);
    p.b.post_recv(1, Some((&buf, 0, 64)));
    p.b.post_recv(2, Some((&buf, 64, 64)));
    p.post(1, SendOpcode::Send, &[7; 65]);
    let out = p.run(|_| false);
    assert_eq!(out, [RxOutcome::Dropped(UcDropReason::MessageTooLong)]);
    let wc = p.b.rcq.pop().expect("error completion");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocalQpOperationError));
    assert_eq!(p.b.qp.state(), QpState::Error);
    assert_eq!(
        p.b.qp.take_error_event(),
        Some(QpErrorCause::MessageTooLong)
    );
    // The QP then flushes the remaining WR.
    let (mut scq, mut rcq) = (VecCq::new(8), VecCq::new(8));
    assert!(p.b.qp.flush(&mut scq, &mut rcq));
    let flushed = rcq.pop().expect("flush");
    assert_eq!((flushed.wr_id, flushed.status), (2, WcStatus::WrFlushError));
    // And drops what still arrives.
    p.post(2, SendOpcode::Send, &[1; 8]);
    assert_eq!(
        p.run(|_| false),
        [RxOutcome::Dropped(UcDropReason::QpError)]
    );
    assert_drops(
        &p.b.qp.stats(),
        &[
            (UcDropReason::MessageTooLong, 1),
            (UcDropReason::QpError, 1),
        ],
    );
}

#[test]
fn zero_length_receive_wr_takes_a_zero_length_send() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    p.b.post_recv(5, None);
    p.post(1, SendOpcode::SendWithImm { imm: 42 }, &[]);
    assert_eq!(p.run(|_| false), [RxOutcome::Completed]);
    let wc = p.b.rcq.pop().unwrap();
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.imm, wc.opcode),
        (5, 0, Some(42), WcOpcode::Recv)
    );
    assert_drops(&p.b.qp.stats(), &[]);
}

// ---------------------------------------------------------------------------------------------
// RETH checks
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_rkey_out_of_bounds_and_access_violations_drop_the_write() {
    let mut p = Pair::new(Mtu::Mtu256, 0);
    let ring = p.b.reg(1024, rw_remote());
    let local_only = p.b.reg(1024, RW);
    for i in 0..6 {
        p.b.post_recv(i, None);
    }
    let wwi = |va: u64, rkey: u32, imm: u32| SendOpcode::RdmaWriteWithImm {
        remote_addr: va,
        rkey,
        imm,
    };
    p.post(1, wwi(ring.addr(), ring.key() ^ 0x1, 1), &[1; 64]); // bad rkey
    p.post(2, wwi(ring.addr() + 1000, ring.key(), 2), &[2; 64]); // va + len past the end
    p.post(3, wwi(ring.addr() - 8, ring.key(), 3), &[3; 64]); // va before the start
    p.post(4, wwi(local_only.addr(), local_only.key(), 4), &[4; 64]); // MR without REMOTE_WRITE
    p.post(5, wwi(ring.addr() + 512, ring.key(), 5), &pattern(600, 5)); // multi-packet, past end
    p.post(6, wwi(ring.addr(), ring.key(), 6), &[6; 64]); // fine
    let out = p.run(|_| false);
    assert_eq!(
        out,
        [
            RxOutcome::Dropped(UcDropReason::BadRkey),
            RxOutcome::Dropped(UcDropReason::OutOfBounds),
            RxOutcome::Dropped(UcDropReason::OutOfBounds),
            RxOutcome::Dropped(UcDropReason::AccessDenied),
            RxOutcome::Dropped(UcDropReason::OutOfBounds),
            RxOutcome::Discarded,
            RxOutcome::Discarded,
            RxOutcome::Completed,
        ]
    );
    let wc = p.b.rcq.pop().unwrap();
    assert_eq!(
        (wc.wr_id, wc.imm),
        (0, Some(6)),
        "dropped writes consumed no receive WR"
    );
    let mut got = [0u8; 1024];
    ring.read_at(0, &mut got).unwrap();
    assert!(got[..64].iter().all(|b| *b == 6));
    assert!(
        got[64..].iter().all(|b| *b == 0),
        "nothing of the dropped writes was placed"
    );
    local_only.read_at(0, &mut got).unwrap();
    assert!(got.iter().all(|b| *b == 0));
    assert_drops(
        &p.b.qp.stats(),
        &[
            (UcDropReason::BadRkey, 1),
            (UcDropReason::OutOfBounds, 3),
            (UcDropReason::AccessDenied, 1),
        ],
    );
}

#[test]
fn qp_without_remote_write_drops_writes_but_takes_sends() {
    let mut p = Pair::with_access(Mtu::Mtu1024, 0, RW);
    let ring = p.b.reg(1024, rw_remote());
    let buf = p.b.reg(1024, RW);
    p.b.post_recv(1, Some((&buf, 0, 1024)));
    p.post(
        1,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: ring.addr(),
            rkey: ring.key(),
            imm: 1,
        },
        &[1; 8],
    );
    p.post(
        2,
        SendOpcode::RdmaWrite {
            remote_addr: ring.addr(),
            rkey: ring.key(),
        },
        &[1; 8],
    );
    p.post(3, SendOpcode::Send, &[3; 8]);
    let out = p.run(|_| false);
    assert_eq!(
        out,
        [
            RxOutcome::Dropped(UcDropReason::AccessDenied),
            RxOutcome::Dropped(UcDropReason::AccessDenied),
            RxOutcome::Completed
        ]
    );
    assert_eq!(p.b.rcq.pop().map(|w| (w.wr_id, w.byte_len)), Some((1, 8)));
    assert_drops(&p.b.qp.stats(), &[(UcDropReason::AccessDenied, 2)]);
}

#[test]
fn zero_length_write_skips_the_rkey_check() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    p.b.post_recv(1, None);
    p.post(
        1,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0xbad,
            imm: 9,
        },
        &[],
    );
    assert_eq!(p.run(|_| false), [RxOutcome::Completed]);
    let wc = p.b.rcq.pop().unwrap();
    assert_eq!(
        (wc.byte_len, wc.imm, wc.opcode),
        (0, Some(9), WcOpcode::RecvRdmaWithImm)
    );
    assert_drops(&p.b.qp.stats(), &[]);
}

// ---------------------------------------------------------------------------------------------
// Hand-made packets: opcode sequence, lengths, P_Key, QP state
// ---------------------------------------------------------------------------------------------

fn packet(
    opcode: Opcode,
    psn: u32,
    reth: Option<RethRepr>,
    imm: Option<u32>,
    payload: &[u8],
) -> Vec<u8> {
    let bth = BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey: DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn: 0x22,
        ack_req: false,
        psn: Psn::new(psn),
    };
    let mut out = Vec::new();
    PacketRepr {
        bth,
        reth,
        imm,
        payload,
    }
    .emit(&mut out)
    .expect("emit");
    out
}

#[test]
fn middle_or_last_without_a_message_in_progress_is_an_opcode_sequence_drop() {
    let mut p = Pair::new(Mtu::Mtu256, 0);
    p.b.post_recv(1, None);
    assert_eq!(
        p.deliver(&packet(Opcode::RdmaWriteMiddle, 0, None, None, &[0; 256])),
        RxOutcome::Dropped(UcDropReason::OpcodeSequence)
    );
    assert_eq!(
        p.deliver(&packet(Opcode::RdmaWriteLast, 1, None, None, &[0; 4])),
        RxOutcome::Discarded
    );
    // A SEND packet continuing an RDMA WRITE is out of sequence too.
    let ring = p.b.reg(1024, rw_remote());
    let reth = RethRepr {
        virtual_addr: ring.addr(),
        rkey: ring.key(),
        dma_len: 512,
    };
    assert_eq!(
        p.deliver(&packet(
            Opcode::RdmaWriteFirst,
            2,
            Some(reth),
            None,
            &[1; 256]
        )),
        RxOutcome::Accepted
    );
    assert_eq!(
        p.deliver(&packet(Opcode::SendLast, 3, None, None, &[1; 4])),
        RxOutcome::Dropped(UcDropReason::OpcodeSequence)
    );
    let s = p.b.qp.stats();
    assert_eq!(s.packets_discarded, 1);
    assert_drops(&s, &[(UcDropReason::OpcodeSequence, 2)]);
}

#[test]
fn payload_lengths_must_match_mtu_and_reth() {
    let mut p = Pair::new(Mtu::Mtu256, 0);
    let ring = p.b.reg(4096, rw_remote());
    let reth = |len| {
        Some(RethRepr {
            virtual_addr: ring.addr(),
            rkey: ring.key(),
            dma_len: len,
        })
    };
    // FIRST shorter than the MTU.
    assert_eq!(
        p.deliver(&packet(
            Opcode::RdmaWriteFirst,
            0,
            reth(600),
            None,
            &[0; 200]
        )),
        RxOutcome::Dropped(UcDropReason::BadLength)
    );
    // ONLY longer than the MTU.
    assert_eq!(
        p.deliver(&packet(
            Opcode::RdmaWriteOnly,
            1,
            reth(300),
            None,
            &[0; 300]
        )),
        RxOutcome::Dropped(UcDropReason::BadLength)
    );
    // ONLY whose payload differs from the RETH length.
    assert_eq!(
        p.deliver(&packet(Opcode::RdmaWriteOnly, 2, reth(100), None, &[0; 96])),
        RxOutcome::Dropped(UcDropReason::BadLength)
    );
    // RETH length above 2^31.
    assert_eq!(
        p.deliver(&packet(
            Opcode::RdmaWriteOnly,
            3,
            reth(0x8000_0001),
            None,
            &[0; 4]
        )),
        RxOutcome::Dropped(UcDropReason::BadLength)
    );
    // LAST ending before the RETH length is reached.
    assert_eq!(
        p.deliver(&packet(
            Opcode::RdmaWriteFirst,
            4,
            reth(1024),
            None,
            &[0; 256]
        )),
        RxOutcome::Accepted
    );
    assert_eq!(
        p.deliver(&packet(Opcode::RdmaWriteLast, 5, None, None, &[0; 100])),
        RxOutcome::Dropped(UcDropReason::BadLength)
    );
    // A good one afterwards.
    assert_eq!(
        p.deliver(&packet(Opcode::RdmaWriteOnly, 6, reth(8), None, &[5; 8])),
        RxOutcome::Completed
    );
    assert_drops(&p.b.qp.stats(), &[(UcDropReason::BadLength, 5)]);
}

#[test]
fn wrong_pkey_and_unready_qp_are_counted() {
    let mut p = Pair::new(Mtu::Mtu256, 0);
    let mut bad = packet(Opcode::SendOnly, 0, None, None, &[0; 4]);
    bad[2] = 0x12; // P_Key 0x12ff
    assert_eq!(p.deliver(&bad), RxOutcome::Dropped(UcDropReason::BadPkey));
    // A QP still in INIT drops everything.
    let mut c = Side::new(0x33, 4, rw_remote());
    c.post_recv(1, None);
    let pkt = packet(Opcode::SendOnly, 0, None, None, &[]);
    let repr = PacketRepr::parse(&pkt).unwrap();
    assert_eq!(
        c.qp.receive(&repr, &c.mem, &mut c.rcq),
        RxOutcome::Dropped(UcDropReason::QpNotReady)
    );
    assert_drops(&p.b.qp.stats(), &[(UcDropReason::BadPkey, 1)]);
    assert_drops(&c.qp.stats(), &[(UcDropReason::QpNotReady, 1)]);
}

// ---------------------------------------------------------------------------------------------
// CQ overflow and queue limits
// ---------------------------------------------------------------------------------------------

#[test]
fn receive_cq_overflow_moves_the_qp_to_error_and_flushes() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    p.b.rcq = VecCq::new(2);
    let ring = p.b.reg(4096, rw_remote());
    for i in 0..5 {
        p.b.post_recv(i, None);
    }
    for i in 0..4u32 {
        p.post(
            u64::from(i),
            SendOpcode::RdmaWriteWithImm {
                remote_addr: ring.addr(),
                rkey: ring.key(),
                imm: i,
            },
            &[1; 64],
        );
    }
    let out = p.run(|_| false);
    assert_eq!(
        out,
        [
            RxOutcome::Completed,
            RxOutcome::Completed,
            RxOutcome::Dropped(UcDropReason::CqOverflow),
            RxOutcome::Dropped(UcDropReason::QpError)
        ]
    );
    assert_eq!(p.b.qp.state(), QpState::Error);
    assert_eq!(
        p.b.qp.take_error_event(),
        Some(QpErrorCause::RecvCqOverflow)
    );
    assert!(p.b.qp.take_cq_overflow());
    assert_eq!(p.b.qp.take_error_event(), None, "reported once");
    // Drain the CQ, then the remaining WRs (3 and 4; WR 2 was consumed by the lost
    // completion) flush as space allows.
    let imms: Vec<_> = std::iter::from_fn(|| p.b.rcq.pop())
        .map(|w| w.imm)
        .collect();
    assert_eq!(imms, [Some(0), Some(1)]);
    assert!(p.b.qp.needs_flush());
    let mut scq = VecCq::new(4);
    let mut small = VecCq::new(1);
    assert!(
        !p.b.qp.flush(&mut scq, &mut small),
        "CQ of one: partial flush"
    );
    assert!(p.b.qp.flush(&mut scq, &mut p.b.rcq));
    let flushed: Vec<_> = std::iter::once(small.pop().unwrap())
        .chain(std::iter::from_fn(|| p.b.rcq.pop()))
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        flushed,
        [(3, WcStatus::WrFlushError), (4, WcStatus::WrFlushError)]
    );
    assert!(!p.b.qp.needs_flush());
    assert_drops(
        &p.b.qp.stats(),
        &[(UcDropReason::CqOverflow, 1), (UcDropReason::QpError, 1)],
    );
}

#[test]
fn send_cq_overflow_fails_the_requester() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    p.a.scq = VecCq::new(1);
    p.post(1, SendOpcode::Send, &[1; 8]);
    p.post(2, SendOpcode::Send, &[2; 8]);
    p.post(3, SendOpcode::Send, &[3; 8]);
    let pkts = p.transmit();
    assert_eq!(
        pkts.len(),
        2,
        "the packet whose completion overflowed still went out"
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(
        p.a.qp.take_error_event(),
        Some(QpErrorCause::SendCqOverflow)
    );
}

#[test]
fn queues_refuse_beyond_their_depth() {
    let mut a = Side::new(1, 2, RW);
    a.qp.modify_to_rtr(RtrAttr {
        dest_qpn: 2,
        rq_psn: 0,
        path_mtu: Mtu::Mtu256,
    })
    .unwrap();
    a.qp.modify_to_rts(0).unwrap();
    let wqe = SendWqe {
        wr_id: 0,
        opcode: SendOpcode::Send,
        sge: None,
        signaled: false,
    };
    a.qp.post_send(wqe).unwrap();
    a.qp.post_send(wqe).unwrap();
    assert_eq!(a.qp.post_send(wqe), Err(PostRefusal::Full(2)));
    a.post_recv(1, None);
    a.post_recv(2, None);
    assert_eq!(
        a.qp.post_recv(RecvWqe {
            wr_id: 3,
            sge: None
        }),
        Err(RecvRefusal::Full(2))
    );
    // Sending frees send queue slots.
    assert_eq!(a.transmit_checked().len(), 2);
    a.qp.post_send(wqe).unwrap();
}

#[test]
fn deregistered_send_buffer_completes_with_a_protection_error() {
    let mut p = Pair::new(Mtu::Mtu1024, 0);
    let mr = p.a.reg(64, RW);
    p.a.qp
        .post_send(SendWqe {
            wr_id: 5,
            opcode: SendOpcode::Send,
            sge: Some(LocalSge {
                lkey: mr.key(),
                offset: 0,
                length: 64,
            }),
            signaled: false,
        })
        .unwrap();
    assert!(p.a.mem.deregister(mr.key()));
    assert!(p.transmit().is_empty());
    let wc =
        p.a.scq
            .pop()
            .expect("error completion even though unsignaled");
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocalProtectionError));
    assert_eq!(p.a.qp.state(), QpState::Error);
}

/// The sink trait is object safe and usable with a closure-like adapter.
struct Counting(usize);
impl CompletionSink for Counting {
    fn push(
        &mut self,
        _: uctel_transport::api::WorkCompletion,
    ) -> Result<(), uctel_transport::soft::engine::CqFull> {
        self.0 += 1;
        Ok(())
    }
}

#[test]
fn many_messages_through_a_custom_sink() {
    let mut p = Pair::new(Mtu::Mtu4096, 1);
    let ring = p.b.reg(1 << 16, rw_remote());
    let mut sink = Counting(0);
    for round in 0..10u32 {
        for i in 0..50u32 {
            p.b.post_recv(u64::from(i), None);
            p.post(
                0,
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: ring.addr() + u64::from(i) * 1024,
                    rkey: ring.key(),
                    imm: round * 50 + i,
                },
                &[i as u8; 1024],
            );
        }
        let pkts = p.transmit();
        for x in &pkts {
            let repr = PacketRepr::parse(x).unwrap();
            assert_eq!(
                p.b.qp.receive(&repr, &p.b.mem, &mut sink),
                RxOutcome::Completed
            );
        }
    }
    assert_eq!(sink.0, 500);
    assert_eq!(p.b.qp.stats().messages_completed, 500);
}
