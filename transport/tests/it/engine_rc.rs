//! Sans-IO RC engine tests: two `RcQp`s wired back to back through two packet queues and a
//! virtual clock (a base `Instant` plus offsets the test moves). The test decides the fate of
//! every packet; timers fire only when the wire is idle, at the time the engines ask for. Every
//! drive loop is bounded, so a hang fails the test.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use uctel_transport::api::{
    AccessFlags, Mtu, QpErrorCause, QpState, SendOpcode, UcDropReason, WcOpcode, WcStatus,
    WorkCompletion,
};
use uctel_transport::soft::engine::{LocalSge, RecvWqe, SendWqe, VecCq};
use uctel_transport::soft::memory::{MrTable, SoftMr};
use uctel_transport::soft::packet::{
    rnr_timer_micros, AethSyndrome, NakCode, RcOpcode, RcPacketRepr,
};
use uctel_transport::soft::rc::{
    ack_timeout, RcQp, RcQpConfig, RcRtrAttr, RcRtsAttr, RcRxOutcome, MAX_UNACKED_PSNS,
};

/// Upper bound on packets moved per drive loop.
const MAX_STEPS: usize = 100_000;

/// ACK timeout exponent used by the tests: 4.096 µs × 2^14 ≈ 67 ms.
const TIMEOUT: u8 = 14;

/// RNR timer code the responder announces: 1.28 ms.
const MIN_RNR_TIMER: u8 = 14;

fn rw_remote() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// Requester `a` → responder `b` (requests).
    AtoB,
    /// `b` → `a` (responses).
    BtoA,
}

/// What the test does with one packet about to be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Deliver,
    Drop,
}

struct Side {
    qp: RcQp,
    mem: MrTable,
    scq: VecCq,
    rcq: VecCq,
    mrs: Vec<Arc<SoftMr>>,
}

impl Side {
    fn new(qpn: u32, access: AccessFlags) -> Self {
        let mut qp = RcQp::new(RcQpConfig {
            qpn,
            max_send_wr: 256,
            max_recv_wr: 256,
        });
        qp.modify_to_init(access).expect("init");
        Side {
            qp,
            mem: MrTable::new(),
            scq: VecCq::new(4096),
            rcq: VecCq::new(4096),
            mrs: Vec::new(),
        }
    }

    fn reg(&mut self, len: usize, access: AccessFlags) -> Arc<SoftMr> {
        let mr = self.mem.register(len, access).expect("reg_mr");
        self.mrs.push(mr.clone());
        mr
    }

    fn scq_all(&mut self) -> Vec<WorkCompletion> {
        self.scq.wcs.drain(..).collect()
    }

    fn rcq_all(&mut self) -> Vec<WorkCompletion> {
        self.rcq.wcs.drain(..).collect()
    }
}

#[derive(Clone, Copy, Debug)]
struct Params {
    mtu: Mtu,
    a_psn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            mtu: Mtu::Mtu256,
            a_psn: 100,
            timeout: TIMEOUT,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// Requester `a` → responder `b`, two wires and a clock.
struct Pair {
    a: Side,
    b: Side,
    a2b: VecDeque<Vec<u8>>,
    b2a: VecDeque<Vec<u8>>,
    base: Instant,
    now: Instant,
    /// Receive buffers at `b`, by receive wr_id.
    recv_bufs: Vec<(u64, Arc<SoftMr>)>,
}

impl Pair {
    fn new(p: Params) -> Pair {
        let mut a = Side::new(0x11, AccessFlags::LOCAL_WRITE);
        let mut b = Side::new(0x22, rw_remote());
        a.qp.modify_to_rtr(RcRtrAttr {
            dest_qpn: 0x22,
            rq_psn: 0,
            path_mtu: p.mtu,
            min_rnr_timer: MIN_RNR_TIMER,
        })
        .expect("rtr");
        a.qp.modify_to_rts(RcRtsAttr {
            sq_psn: p.a_psn,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
        })
        .expect("rts");
        b.qp.modify_to_rtr(RcRtrAttr {
            dest_qpn: 0x11,
            rq_psn: p.a_psn,
            path_mtu: p.mtu,
            min_rnr_timer: MIN_RNR_TIMER,
        })
        .expect("rtr");
        b.qp.modify_to_rts(RcRtsAttr {
            sq_psn: 0,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
        })
        .expect("rts");
        let base = Instant::now();
        Pair {
            a,
            b,
            a2b: VecDeque::new(),
            b2a: VecDeque::new(),
            base,
            now: base,
            recv_bufs: Vec::new(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.now - self.base
    }

    /// Posts a signaled send WR at `a` whose data is `data` (copied into a fresh MR).
    fn post(&mut self, wr_id: u64, opcode: SendOpcode, data: &[u8]) {
        let sge = if data.is_empty() {
            None
        } else {
            let mr = self.a.reg(data.len(), AccessFlags::LOCAL_WRITE);
            mr.write_at(0, data).expect("write_at");
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

    /// Posts a receive WR at `b` with a fresh buffer of `len` bytes.
    fn post_recv(&mut self, wr_id: u64, len: u32) {
        let sge = if len == 0 {
            None
        } else {
            let mr = self.b.reg(len as usize, AccessFlags::LOCAL_WRITE);
            self.recv_bufs.push((wr_id, mr.clone()));
            Some(LocalSge {
                lkey: mr.key(),
                offset: 0,
                length: len,
            })
        };
        self.b
            .qp
            .post_recv(RecvWqe { wr_id, sge })
            .expect("post_recv");
    }

    /// The bytes a receive WC delivered.
    fn received(&self, wc: &WorkCompletion) -> Vec<u8> {
        let Some((_, mr)) = self.recv_bufs.iter().find(|(id, _)| *id == wc.wr_id) else {
            return Vec::new();
        };
        let mut out = vec![0u8; wc.byte_len as usize];
        mr.read_at(0, &mut out).expect("read_at");
        out
    }

    /// Pulls every packet both sides have to send now onto the wires.
    fn pull(&mut self) {
        for _ in 0..MAX_STEPS {
            let mut buf = Vec::new();
            if self
                .a
                .qp
                .poll_transmit(self.now, &self.a.mem, &mut buf)
                .is_some()
            {
                self.a2b.push_back(buf);
                continue;
            }
            if self
                .b
                .qp
                .poll_transmit(self.now, &self.b.mem, &mut buf)
                .is_some()
            {
                self.b2a.push_back(buf);
                continue;
            }
            return;
        }
        panic!("engines produced more than {MAX_STEPS} packets at once");
    }

    fn deliver(&mut self, dir: Dir, pkt: &[u8]) -> RcRxOutcome {
        let repr = RcPacketRepr::parse(pkt).expect("parse");
        let side = match dir {
            Dir::AtoB => &mut self.b,
            Dir::BtoA => &mut self.a,
        };
        side.qp
            .receive(self.now, &repr, &side.mem, &mut side.scq, &mut side.rcq)
    }

    /// The earliest timer of either side.
    fn next_timeout(&self) -> Option<Instant> {
        match (self.a.qp.poll_timeout(), self.b.qp.poll_timeout()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }

    /// Runs the pair until nothing is on the wire, nothing is due and no timer runs: packets
    /// in order, `fate` deciding each, timers fired when the wire is idle.
    fn run(&mut self, mut fate: impl FnMut(Dir, &RcPacketRepr<'_>) -> Fate) {
        for _ in 0..MAX_STEPS {
            self.pull();
            let next = if let Some(p) = self.a2b.pop_front() {
                Some((Dir::AtoB, p))
            } else {
                self.b2a.pop_front().map(|p| (Dir::BtoA, p))
            };
            match next {
                Some((dir, pkt)) => {
                    let repr = RcPacketRepr::parse(&pkt).expect("parse");
                    if fate(dir, &repr) == Fate::Deliver {
                        self.deliver(dir, &pkt);
                    }
                }
                None => match self.next_timeout() {
                    Some(t) => {
                        self.now = self.now.max(t);
                        self.a.qp.handle_timeout(self.now);
                        self.b.qp.handle_timeout(self.now);
                    }
                    None => return,
                },
            }
        }
        panic!("pair did not settle in {MAX_STEPS} steps");
    }

    fn run_clean(&mut self) {
        self.run(|_, _| Fate::Deliver);
    }

    fn flush(&mut self) {
        assert!(self.a.qp.flush(&mut self.a.scq, &mut self.a.rcq));
        assert!(self.b.qp.flush(&mut self.b.scq, &mut self.b.rcq));
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn send_imm(imm: u32) -> SendOpcode {
    SendOpcode::SendWithImm { imm }
}

#[test]
fn single_packet_send_completes_only_when_acked() {
    let mut p = Pair::new(Params::default());
    p.post_recv(7, 256);
    let data = pattern(100, 1);
    p.post(1, SendOpcode::Send, &data);

    let mut buf = Vec::new();
    let info =
        p.a.qp
            .poll_transmit(p.now, &p.a.mem, &mut buf)
            .expect("request");
    assert_eq!(info.opcode, RcOpcode::SendOnly);
    assert!(info.ack_req, "rxe sets AckReq on the last packet");
    assert_eq!(info.psn, 100);
    assert!(p.a.qp.poll_timeout().is_some(), "retransmit timer armed");
    assert_eq!(p.deliver(Dir::AtoB, &buf), RcRxOutcome::Completed);
    assert!(p.a.scq.wcs.is_empty(), "no send WC before the ACK");
    assert_eq!(p.b.qp.msn(), 1);

    let mut ack = Vec::new();
    let info =
        p.b.qp
            .poll_transmit(p.now, &p.b.mem, &mut ack)
            .expect("ack");
    assert_eq!(info.opcode, RcOpcode::Acknowledge);
    assert_eq!(info.psn, 100);
    let repr = RcPacketRepr::parse(&ack).expect("parse");
    let aeth = repr.aeth.expect("aeth");
    assert_eq!(aeth.syndrome, AethSyndrome::Ack { credits: 0x1f });
    assert_eq!(aeth.msn, 1);
    assert_eq!(p.deliver(Dir::BtoA, &ack), RcRxOutcome::Response);

    let wcs = p.a.scq_all();
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode, wcs[0].byte_len),
        (1, WcStatus::Success, WcOpcode::Send, 100)
    );
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 1);
    assert_eq!(p.received(&rwcs[0]), data);
    assert_eq!(
        p.a.qp.poll_timeout(),
        None,
        "timer cleared when all is acked"
    );
    assert_eq!(p.a.qp.sq_len(), 0);
    let (sa, sb) = (p.a.qp.stats(), p.b.qp.stats());
    assert_eq!((sa.qp.packets_sent, sa.acks_received), (1, 1));
    assert_eq!((sb.acks_sent, sb.qp.messages_completed), (1, 1));
}

#[test]
fn multi_packet_send_and_write_with_imm_are_delivered() {
    let mut p = Pair::new(Params::default());
    let target = p.b.reg(4096, rw_remote());
    p.post_recv(1, 2048);
    p.post_recv(2, 0);
    let send = pattern(256 * 3 + 17, 2);
    let write = pattern(256 * 2 + 1, 3);
    p.post(10, send_imm(0xdead_beef), &send);
    p.post(
        11,
        SendOpcode::RdmaWriteWithImm {
            remote_addr: target.addr() + 64,
            rkey: target.key(),
            imm: 42,
        },
        &write,
    );

    // AckReq only on the last packet of each message.
    let mut seen = Vec::new();
    for _ in 0..7 {
        let mut buf = Vec::new();
        let info =
            p.a.qp
                .poll_transmit(p.now, &p.a.mem, &mut buf)
                .expect("packet");
        seen.push((info.opcode, info.ack_req));
        p.a2b.push_back(buf);
    }
    assert_eq!(
        seen,
        vec![
            (RcOpcode::SendFirst, false),
            (RcOpcode::SendMiddle, false),
            (RcOpcode::SendMiddle, false),
            (RcOpcode::SendLastWithImmediate, true),
            (RcOpcode::RdmaWriteFirst, false),
            (RcOpcode::RdmaWriteMiddle, false),
            (RcOpcode::RdmaWriteLastWithImmediate, true),
        ]
    );
    p.run_clean();

    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 2);
    assert_eq!((rwcs[0].wr_id, rwcs[0].imm), (1, Some(0xdead_beef)));
    assert_eq!(p.received(&rwcs[0]), send);
    assert_eq!(
        (rwcs[1].wr_id, rwcs[1].opcode, rwcs[1].byte_len, rwcs[1].imm),
        (2, WcOpcode::RecvRdmaWithImm, write.len() as u32, Some(42))
    );
    let mut placed = vec![0u8; write.len()];
    target.read_at(64, &mut placed).expect("read");
    assert_eq!(placed, write);
    let swcs = p.a.scq_all();
    assert_eq!(
        swcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::RdmaWrite)
        ]
    );
    assert_eq!(p.b.qp.msn(), 2);
    assert_eq!(p.b.qp.stats().acks_sent, 2);
    assert_eq!(p.a.qp.stats().packets_retransmitted, 0);
    assert_eq!(p.elapsed(), Duration::ZERO, "no timer fired");
}

#[test]
fn lost_ack_times_out_and_the_duplicate_is_acked_not_redelivered() {
    let mut p = Pair::new(Params::default());
    p.post_recv(1, 1024);
    let data = pattern(600, 4);
    p.post(5, SendOpcode::Send, &data);
    let mut acks_dropped = 0;
    p.run(|dir, pkt| {
        if dir == Dir::BtoA && acks_dropped == 0 {
            assert_eq!(pkt.bth.opcode, RcOpcode::Acknowledge);
            acks_dropped += 1;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    assert_eq!(acks_dropped, 1);
    let (sa, sb) = (p.a.qp.stats(), p.b.qp.stats());
    assert_eq!(sa.timeouts, 1);
    assert_eq!(
        sa.packets_retransmitted, 3,
        "go back to the oldest unacked PSN"
    );
    assert_eq!(sb.duplicates, 3);
    assert_eq!(sb.qp.messages_completed, 1);
    assert!(p.elapsed() >= ack_timeout(TIMEOUT).expect("timeout"));
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 1, "delivered once");
    assert_eq!(p.received(&rwcs[0]), data);
    let swcs = p.a.scq_all();
    assert_eq!(swcs.len(), 1);
    assert_eq!(swcs[0].status, WcStatus::Success);
    assert_eq!(p.a.qp.state(), QpState::Rts);
}

#[test]
fn packet_lost_mid_message_is_naked_once_and_resent_go_back_n() {
    let mut p = Pair::new(Params::default());
    p.post_recv(1, 4096);
    p.post_recv(2, 4096);
    let first = pattern(256 * 4, 5);
    let second = pattern(300, 6);
    p.post(1, SendOpcode::Send, &first);
    p.post(2, SendOpcode::Send, &second);
    // PSNs 100..=103 first message, 104..=105 second. Lose 101 once.
    let mut lost = false;
    let mut naks = Vec::new();
    p.run(|dir, pkt| {
        if dir == Dir::AtoB && pkt.bth.psn.value() == 101 && !lost {
            lost = true;
            return Fate::Drop;
        }
        if let Some(aeth) = pkt.aeth {
            if let AethSyndrome::Nak(code) = aeth.syndrome {
                naks.push((code, pkt.bth.psn.value()));
            }
        }
        Fate::Deliver
    });
    assert_eq!(
        naks,
        vec![(NakCode::PsnSequenceError, 101)],
        "one NAK per gap"
    );
    let (sa, sb) = (p.a.qp.stats(), p.b.qp.stats());
    assert_eq!(sb.out_of_sequence, 4, "102..=105 arrived ahead");
    assert_eq!(sb.naks_sent, 1);
    assert_eq!(sa.naks_received, 1);
    assert_eq!(sa.packets_retransmitted, 5, "101..=105 again");
    assert_eq!(sa.timeouts, 0, "the NAK, not the timer, recovered");
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 2);
    assert_eq!(p.received(&rwcs[0]), first);
    assert_eq!(p.received(&rwcs[1]), second);
    assert_eq!(p.a.scq_all().len(), 2);
    assert_eq!(p.b.qp.expected_psn(), 106);
}

#[test]
fn rnr_nak_waits_the_rnr_timer_then_recovers_after_post_recv() {
    let mut p = Pair::new(Params::default());
    let data = pattern(40, 7);
    p.post(9, send_imm(5), &data);
    p.pull();
    let req = p.a2b.pop_front().expect("request");
    assert_eq!(p.deliver(Dir::AtoB, &req), RcRxOutcome::ReceiverNotReady);
    assert_eq!(p.b.qp.expected_psn(), 100, "PSN does not move on RNR");
    p.pull();
    let nak = p.b2a.pop_front().expect("rnr nak");
    let repr = RcPacketRepr::parse(&nak).expect("parse");
    assert_eq!(
        repr.aeth.expect("aeth").syndrome,
        AethSyndrome::RnrNak {
            timer: MIN_RNR_TIMER
        }
    );
    assert_eq!(repr.bth.psn.value(), 100);
    assert_eq!(p.deliver(Dir::BtoA, &nak), RcRxOutcome::Response);
    // Nothing goes out during the RNR wait.
    let mut buf = Vec::new();
    assert!(p.a.qp.poll_transmit(p.now, &p.a.mem, &mut buf).is_none());
    let wait = Duration::from_micros(u64::from(rnr_timer_micros(MIN_RNR_TIMER)));
    assert_eq!(p.a.qp.poll_timeout(), Some(p.now + wait));
    p.post_recv(3, 64);
    p.run_clean();
    assert_eq!(p.elapsed(), wait);
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 1);
    assert_eq!((rwcs[0].wr_id, rwcs[0].imm), (3, Some(5)));
    assert_eq!(p.received(&rwcs[0]), data);
    assert_eq!(p.a.scq_all()[0].status, WcStatus::Success);
    let (sa, sb) = (p.a.qp.stats(), p.b.qp.stats());
    assert_eq!((sa.rnr_naks_received, sb.rnr_naks_sent), (1, 1));
    assert_eq!(sa.packets_retransmitted, 1);
}

#[test]
fn rnr_retry_exhausted_fails_the_wr() {
    let mut p = Pair::new(Params {
        rnr_retry: 1,
        ..Params::default()
    });
    p.post(1, SendOpcode::Send, &pattern(10, 8));
    p.post(2, SendOpcode::Send, &pattern(10, 9));
    p.run_clean();
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(p.a.qp.error_cause(), Some(QpErrorCause::RnrRetryExceeded));
    p.flush();
    let swcs = p.a.scq_all();
    assert_eq!(
        swcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::RnrRetryExceededError),
            (2, WcStatus::WrFlushError)
        ]
    );
    assert_eq!(p.a.qp.stats().rnr_naks_received, 2);
    assert_eq!(p.a.qp.stats().rnr_retry_exceeded, 1);
    assert_eq!(
        p.b.qp.state(),
        QpState::Rts,
        "RNR does not hurt the responder"
    );
}

#[test]
fn retry_exhausted_completes_with_retry_exc_err_and_moves_to_error() {
    let mut p = Pair::new(Params {
        retry_cnt: 2,
        ..Params::default()
    });
    p.post_recv(1, 64);
    p.post(1, SendOpcode::Send, &pattern(10, 10));
    p.post(2, SendOpcode::Send, &pattern(10, 11));
    p.run(|dir, _| match dir {
        Dir::AtoB => Fate::Drop,
        Dir::BtoA => Fate::Deliver,
    });
    let sa = p.a.qp.stats();
    assert_eq!(
        sa.timeouts, 3,
        "the first try and two retries all timed out"
    );
    assert_eq!(sa.retry_exceeded, 1);
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(p.a.qp.error_cause(), Some(QpErrorCause::RetryExceeded));
    assert_eq!(p.a.qp.take_error_event(), Some(QpErrorCause::RetryExceeded));
    assert_eq!(p.a.qp.poll_timeout(), None);
    let t = ack_timeout(TIMEOUT).expect("timeout");
    assert_eq!(p.elapsed(), t * 3);
    assert!(p.a.qp.needs_flush());
    p.flush();
    let swcs = p.a.scq_all();
    assert_eq!(
        swcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::RetryExceededError),
            (2, WcStatus::WrFlushError)
        ]
    );
    assert!(p.b.rcq_all().is_empty());
}

#[test]
fn timeout_zero_never_retransmits() {
    let mut p = Pair::new(Params {
        timeout: 0,
        ..Params::default()
    });
    p.post(1, SendOpcode::Send, &pattern(10, 12));
    p.run(|_, _| Fate::Drop);
    assert_eq!(p.a.qp.poll_timeout(), None);
    assert_eq!(p.a.qp.stats().timeouts, 0);
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(p.a.qp.sq_len(), 1, "waits for its ACK forever");
}

#[test]
fn psn_wraps_at_2_pow_24_with_loss_across_the_wrap() {
    let mut p = Pair::new(Params {
        a_psn: 0xff_fffe,
        ..Params::default()
    });
    p.post_recv(1, 4096);
    p.post_recv(2, 4096);
    let first = pattern(256 * 3, 13); // 0xfffffe, 0xffffff, 0x000000
    let second = pattern(256 * 2, 14); // 0x000001, 0x000002
    p.post(1, SendOpcode::Send, &first);
    p.post(2, SendOpcode::Send, &second);
    let mut lost = false;
    p.run(|dir, pkt| {
        if dir == Dir::AtoB && pkt.bth.psn.value() == 0xff_ffff && !lost {
            lost = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    assert!(lost);
    assert_eq!(p.b.qp.expected_psn(), 3);
    assert_eq!(p.a.qp.sq_psn(), 3);
    assert_eq!(p.a.qp.unacked_psn(), 3);
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 2);
    assert_eq!(p.received(&rwcs[0]), first);
    assert_eq!(p.received(&rwcs[1]), second);
    assert_eq!(p.b.qp.stats().naks_sent, 1);
    assert_eq!(
        p.a.scq_all().iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success; 2]
    );
}

#[test]
fn coalesced_ack_completes_every_wr_it_covers() {
    let mut p = Pair::new(Params::default());
    for i in 0..3 {
        p.post_recv(i, 64);
        p.post(i, SendOpcode::Send, &pattern(8, i as u8));
    }
    // Lose the ACKs of the first two messages; the third acknowledges all.
    let mut acks = 0;
    p.run(|dir, _| {
        if dir == Dir::BtoA {
            acks += 1;
            if acks <= 2 {
                return Fate::Drop;
            }
        }
        Fate::Deliver
    });
    assert_eq!(
        p.a.scq_all().iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // The responder queued one ACK per message, but consecutive ACKs coalesce in its queue:
    // here each was pulled before the next was queued, so three went out.
    assert_eq!(p.b.qp.stats().acks_sent, 3);
    assert_eq!(p.a.qp.stats().timeouts, 0);
}

#[test]
fn acks_queued_back_to_back_coalesce_into_the_latest() {
    let mut p = Pair::new(Params::default());
    for i in 0..3 {
        p.post_recv(i, 64);
        p.post(i, SendOpcode::Send, &pattern(8, i as u8));
    }
    // Deliver all three requests before the responder is polled.
    let mut reqs = Vec::new();
    let mut buf = Vec::new();
    while p.a.qp.poll_transmit(p.now, &p.a.mem, &mut buf).is_some() {
        reqs.push(std::mem::take(&mut buf));
    }
    for r in &reqs {
        assert_eq!(p.deliver(Dir::AtoB, r), RcRxOutcome::Completed);
    }
    assert_eq!(p.b.qp.pending_responses(), 1);
    let info =
        p.b.qp
            .poll_transmit(p.now, &p.b.mem, &mut buf)
            .expect("ack");
    assert_eq!((info.psn, info.syndrome.is_some()), (102, true));
    let aeth = RcPacketRepr::parse(&buf)
        .expect("parse")
        .aeth
        .expect("aeth");
    assert_eq!(aeth.msn, 3);
    assert_eq!(p.deliver(Dir::BtoA, &buf), RcRxOutcome::Response);
    assert_eq!(p.a.scq_all().len(), 3);
}

#[test]
fn window_holds_at_most_max_unacked_psns_and_ack_req_every_66th_packet() {
    let mut p = Pair::new(Params::default());
    p.post_recv(1, 256 * 200);
    p.post(1, SendOpcode::Send, &pattern(256 * 200, 15));
    p.pull();
    assert_eq!(p.a2b.len(), MAX_UNACKED_PSNS as usize);
    let ack_reqs: Vec<usize> = p
        .a2b
        .iter()
        .enumerate()
        .filter(|(_, b)| RcPacketRepr::parse(b).expect("parse").bth.ack_req)
        .map(|(i, _)| i)
        .collect();
    // rxe: `noack_pkts++ > RXE_MAX_PKT_PER_ACK` sets AckReq on the 66th packet after the last.
    assert_eq!(ack_reqs, vec![65]);
    p.run_clean();
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs.len(), 1);
    assert_eq!(rwcs[0].byte_len, 256 * 200);
    assert_eq!(p.a.scq_all().len(), 1);
}

#[test]
fn remote_access_error_nak_fails_the_write() {
    let mut p = Pair::new(Params::default());
    let target = p.b.reg(64, rw_remote());
    p.post(
        1,
        SendOpcode::RdmaWrite {
            remote_addr: target.addr(),
            rkey: target.key() ^ 0x100,
        },
        &pattern(16, 16),
    );
    p.run_clean();
    assert_eq!(p.b.qp.state(), QpState::Error);
    assert_eq!(p.b.qp.error_cause(), Some(QpErrorCause::RequestError));
    assert_eq!(p.b.qp.stats().qp.drops.get(UcDropReason::BadRkey), 1);
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert_eq!(p.a.qp.error_cause(), Some(QpErrorCause::RemoteNak));
    let swcs = p.a.scq_all();
    assert_eq!(swcs.len(), 1);
    assert_eq!(swcs[0].status, WcStatus::RemoteAccessError);
}

#[test]
fn stale_and_ghost_responses_are_ignored() {
    let mut q = Pair::new(Params::default());
    q.post_recv(1, 64);
    q.post(1, SendOpcode::Send, &pattern(8, 18));
    q.pull();
    let req = q.a2b.pop_front().expect("req");
    q.deliver(Dir::AtoB, &req);
    q.pull();
    let ack = q.b2a.pop_front().expect("ack");
    assert_eq!(q.deliver(Dir::BtoA, &ack), RcRxOutcome::Response);
    // Replayed, the ACK is stale; with its PSN moved past anything sent, a ghost.
    assert_eq!(q.deliver(Dir::BtoA, &ack), RcRxOutcome::StaleResponse);
    let mut ghost = ack.clone();
    ghost[11] = ghost[11].wrapping_add(5);
    assert_eq!(q.deliver(Dir::BtoA, &ghost), RcRxOutcome::StaleResponse);
    assert_eq!(q.a.qp.stats().stale_responses, 2);
    assert_eq!(q.a.scq_all().len(), 1);
}

#[test]
fn opcode_sequence_error_is_naked_invalid_request() {
    let mut p = Pair::new(Params::default());
    p.post_recv(1, 1024);
    p.post(1, SendOpcode::Send, &pattern(600, 19));
    p.pull();
    // Turn the FIRST (PSN 100) into a MIDDLE: a MIDDLE with no message in progress.
    let mut first = p.a2b.pop_front().expect("first");
    first[0] = RcOpcode::SendMiddle.as_u8();
    p.a2b.clear();
    assert_eq!(
        p.deliver(Dir::AtoB, &first),
        RcRxOutcome::Dropped(UcDropReason::OpcodeSequence)
    );
    assert_eq!(p.b.qp.state(), QpState::Error);
    p.run(|dir, pkt| {
        if dir == Dir::BtoA {
            assert_eq!(
                pkt.aeth.expect("aeth").syndrome,
                AethSyndrome::Nak(NakCode::InvalidRequest)
            );
            assert_eq!(pkt.bth.psn.value(), 100);
        }
        Fate::Deliver
    });
    assert_eq!(p.a.qp.state(), QpState::Error);
    let swcs = p.a.scq_all();
    assert_eq!(swcs.len(), 1);
    assert_eq!(swcs[0].status, WcStatus::RemoteInvalidRequestError);
    p.flush();
    assert_eq!(p.b.rcq_all()[0].status, WcStatus::WrFlushError);
}

#[test]
fn send_longer_than_its_receive_buffer_fails_both_sides() {
    let mut p = Pair::new(Params::default());
    p.post_recv(1, 100);
    p.post(1, SendOpcode::Send, &pattern(200, 20));
    p.run_clean();
    assert_eq!(p.b.qp.error_cause(), Some(QpErrorCause::MessageTooLong));
    let rwcs = p.b.rcq_all();
    assert_eq!(rwcs[0].status, WcStatus::LocalQpOperationError);
    assert_eq!(p.b.qp.stats().qp.drops.get(UcDropReason::MessageTooLong), 1);
    let swcs = p.a.scq_all();
    assert_eq!(swcs[0].status, WcStatus::RemoteOperationError);
    assert_eq!(p.a.qp.error_cause(), Some(QpErrorCause::RemoteNak));
}

#[test]
fn packets_before_rtr_are_dropped_and_counted() {
    let mut p = Pair::new(Params::default());
    p.post(1, SendOpcode::Send, &pattern(4, 21));
    p.pull();
    let req = p.a2b.pop_front().expect("req");
    let mut c = Side::new(0x33, rw_remote());
    let repr = RcPacketRepr::parse(&req).expect("parse");
    assert_eq!(
        c.qp.receive(p.now, &repr, &c.mem, &mut c.scq, &mut c.rcq),
        RcRxOutcome::Dropped(UcDropReason::QpNotReady)
    );
    let s = c.qp.stats();
    assert_eq!(s.qp.packets_received, 1);
    assert_eq!(s.qp.drops.get(UcDropReason::QpNotReady), 1);
    let mut buf = Vec::new();
    assert!(c.qp.poll_transmit(p.now, &c.mem, &mut buf).is_none());
}

/// One packet in flight in the property test.
struct Flight {
    dir: Dir,
    bytes: Vec<u8>,
}

/// Drives `p` with a seeded wire that drops, duplicates and reorders packets in both
/// directions, never losing more than `max_losses` packets between two ACKs that move the
/// requester's window. Returns the number of packets lost.
fn run_faulty(p: &mut Pair, seed: u64, loss_pct: u32, dup_pct: u32, max_losses: u32) -> u32 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut wire: Vec<Flight> = Vec::new();
    let mut losses_since_progress = 0;
    let mut una = p.a.qp.unacked_psn();
    let mut lost = 0;
    for _ in 0..MAX_STEPS {
        p.pull();
        wire.extend(p.a2b.drain(..).map(|bytes| Flight {
            dir: Dir::AtoB,
            bytes,
        }));
        wire.extend(p.b2a.drain(..).map(|bytes| Flight {
            dir: Dir::BtoA,
            bytes,
        }));
        if wire.is_empty() {
            match p.next_timeout() {
                Some(t) => {
                    p.now = p.now.max(t);
                    p.a.qp.handle_timeout(p.now);
                    p.b.qp.handle_timeout(p.now);
                    continue;
                }
                None => return lost,
            }
        }
        // Reorder: any packet on the wire may go next.
        let i = rng.gen_range(0..wire.len());
        let f = wire.swap_remove(i);
        if losses_since_progress < max_losses && rng.gen_range(0..100) < loss_pct {
            losses_since_progress += 1;
            lost += 1;
            continue;
        }
        if rng.gen_range(0..100) < dup_pct {
            wire.push(Flight {
                dir: f.dir,
                bytes: f.bytes.clone(),
            });
        }
        p.deliver(f.dir, &f.bytes);
        let now_una = p.a.qp.unacked_psn();
        if now_una != una {
            una = now_una;
            losses_since_progress = 0;
        }
    }
    panic!("faulty run did not settle in {MAX_STEPS} steps");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Under any seeded pattern of drops, duplicates and reorders in both directions, with at
    /// most 3 losses between two ACKs that move the window (below `retry_cnt` = 7), every
    /// message is delivered exactly once and in order and every send WR completes successfully.
    #[test]
    fn faults_never_lose_duplicate_or_reorder_messages(
        seed: u64,
        lens in proptest::collection::vec(0usize..900, 1..12),
        writes in proptest::collection::vec(any::<bool>(), 12),
        loss_pct in 0u32..40,
        dup_pct in 0u32..30,
        a_psn in prop_oneof![Just(0xff_fff0u32), 0u32..(1 << 24)],
    ) {
        let mut p = Pair::new(Params { a_psn, ..Params::default() });
        let target = p.b.reg(1024 * 12, rw_remote());
        let mut expect = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let data = pattern(len, i as u8);
            p.post_recv(i as u64, 1024);
            let opcode = if writes[i] {
                SendOpcode::RdmaWriteWithImm {
                    remote_addr: target.addr() + 1024 * i as u64,
                    rkey: target.key(),
                    imm: i as u32,
                }
            } else {
                send_imm(i as u32)
            };
            p.post(i as u64, opcode, &data);
            expect.push(data);
        }
        run_faulty(&mut p, seed, loss_pct, dup_pct, 3);

        prop_assert_eq!(p.a.qp.state(), QpState::Rts);
        prop_assert_eq!(p.b.qp.state(), QpState::Rts);
        let swcs = p.a.scq_all();
        prop_assert_eq!(swcs.len(), lens.len());
        for (i, wc) in swcs.iter().enumerate() {
            prop_assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        }
        let rwcs = p.b.rcq_all();
        prop_assert_eq!(rwcs.len(), lens.len(), "each message exactly once");
        for (i, wc) in rwcs.iter().enumerate() {
            prop_assert_eq!(wc.wr_id, i as u64, "in order");
            prop_assert_eq!(wc.imm, Some(i as u32));
            prop_assert_eq!(wc.status, WcStatus::Success);
            if writes[i] {
                let mut placed = vec![0u8; expect[i].len()];
                target.read_at(1024 * i, &mut placed).expect("read");
                prop_assert_eq!(&placed, &expect[i]);
            } else {
                prop_assert_eq!(&p.received(wc), &expect[i]);
            }
        }
        prop_assert_eq!(p.b.qp.msn(), lens.len() as u32);
        prop_assert_eq!(p.b.qp.stats().qp.messages_completed, lens.len() as u64);
        prop_assert_eq!(p.a.qp.sq_len(), 0);
        // Every inbound packet is accounted for once, on both sides.
        for s in [p.a.qp.stats(), p.b.qp.stats()] {
            prop_assert_eq!(
                s.qp.packets_received,
                s.requests_accounted() + s.responses_accounted() + s.qp.drops.total()
            );
        }
        prop_assert_eq!(p.b.qp.stats().qp.drops.total(), 0);
    }
}

#[test]
fn faulty_wire_sanity_loses_packets_and_still_delivers() {
    // The property test's wire does lose packets: a run that cannot fail is no test.
    let mut p = Pair::new(Params::default());
    for i in 0..8u64 {
        p.post_recv(i, 1024);
        p.post(i, send_imm(i as u32), &pattern(700, i as u8));
    }
    let lost = run_faulty(&mut p, 7, 30, 20, 3);
    assert!(lost > 0);
    assert_eq!(p.b.rcq_all().len(), 8);
    let sa = p.a.qp.stats();
    assert!(sa.packets_retransmitted > 0);
    assert_eq!(p.a.scq_all().len(), 8);
}
