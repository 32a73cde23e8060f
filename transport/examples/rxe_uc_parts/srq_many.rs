//! `rxe_uc srq-many`: many UC QPs on one completion queue and one shared receive queue, in one
//! process on one device (rxe0 talking to itself through its netdev), through the uctel
//! transport API.
//!
//! `--qps N` sender QPs share one send CQ and one receive CQ; their N peers share one receive
//! CQ and take their receive WRs from one SRQ (`ibv_create_srq`, `ibv_post_srq_recv`), and
//! one send CQ. Each of `--count` rounds posts one message per sender (`--op write-imm`: RDMA
//! Write-with-immediate into the receiver's slot of one ring, zero-length SRQ WRs; `--op
//! send-imm`: Send-with-immediate into SRQ buffers) and polls the shared receive CQ until the
//! round arrived, re-posting one SRQ WR per completion. The immediate carries the sender's
//! index (high 8 bits) and the round (low 24 bits), so a completion whose `qp_num` names
//! another receiver than the immediate's sender is connected to fails, as does a message
//! missing, twice, or with a wrong opcode, `byte_len` or payload byte.
//!
//! Then the SRQ limit event: the limit is armed just below the SRQ's fill level
//! (`ibv_modify_srq(IBV_SRQ_LIMIT)`), one more round is sent without re-posting, and
//! `IBV_EVENT_SRQ_LIMIT_REACHED` naming this SRQ must arrive (IBTA vol. 1 10.2.9; rxe
//! `get_srq_wqe`). Any other asynchronous event fails. Teardown drops the QPs before the SRQ
//! before the PD (each child holds its parent in the transport).

use std::time::Instant;

use super::{fill, first_mismatch, open, Args, Op, Result, SEQ_BYTES};
use uctel_transport::api::TransportKind;
use uctel_transport::api::{
    AccessFlags, AsyncEvent, CompletionQueue, MemoryRegion, QpInitAttr, QpType, QueuePair, RecvWr,
    SendWr, Sge, SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion,
};

/// Receive WRs posted to the SRQ (rxe's `max_srq_wr` is 2^14 − 1).
const SRQ_WRS: u32 = 1024;
/// Send queue depth of each sender QP (one message per round in flight).
const SQ_WRS: u32 = 16;
/// Ring slots per receiver (write-imm: round `r` goes to slot `r mod SLOTS`).
const SLOTS: usize = 16;
/// SRQ WRs the limit test leaves below the fill level.
const LIMIT_MARGIN: u32 = 8;

/// The immediate of sender `i`'s message of round `r`.
fn imm_of(i: usize, r: u64) -> u32 {
    ((i as u32 & 0xff) << 24) | (r as u32 & 0x00ff_ffff)
}

/// `map_err` with the verb that failed.
fn ctx<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// What the receive side checks and keeps.
struct Rx {
    srq: SharedReceiveQueue,
    qps: Vec<QueuePair>,
    ring: MemoryRegion,
    bufs: MemoryRegion,
    /// Messages received per receiver QP (index = receiver).
    got: Vec<u64>,
    /// Completions whose QP number named a receiver this program did not create.
    unknown_qpn: u64,
    checked: u64,
}

impl Rx {
    fn index_of(&self, qpn: u32) -> Option<usize> {
        self.qps.iter().position(|q| q.qp_num() == qpn)
    }

    /// Posts `n` SRQ WRs (buffers for send-imm, zero-length for write-imm).
    fn post(&self, op: Op, size: usize, first: u64, n: u32) -> Result<()> {
        let wrs: Vec<RecvWr<'_>> = (0..u64::from(n))
            .map(|k| {
                let id = (first + k) % u64::from(SRQ_WRS);
                match op {
                    Op::SendImm => {
                        RecvWr::new(id, Sge::new(&self.bufs, id as usize * size, size as u32))
                    }
                    _ => RecvWr::zero_length(id),
                }
            })
            .collect();
        for chunk in wrs.chunks(64) {
            self.srq
                .post_recv(chunk)
                .map_err(|e| format!("post_srq_recv: {e}"))?;
        }
        Ok(())
    }

    /// Checks one receive completion of round `round`.
    fn check(&mut self, a: &Args, wc: &WorkCompletion, round: u64) -> Result<()> {
        let want = match a.op {
            Op::SendImm => WcOpcode::Recv,
            _ => WcOpcode::RecvRdmaWithImm,
        };
        if wc.status != WcStatus::Success || wc.opcode != want {
            return Err(format!(
                "completion {:?}/{:?} on QP {:#x}, want success/{want:?}",
                wc.status, wc.opcode, wc.qp_num
            ));
        }
        let Some(j) = self.index_of(wc.qp_num) else {
            self.unknown_qpn += 1;
            return Err(format!(
                "completion names QP {:#x}, not a receiver",
                wc.qp_num
            ));
        };
        let imm = wc.imm.ok_or("completion without immediate")?;
        let (i, r) = ((imm >> 24) as usize, u64::from(imm & 0x00ff_ffff));
        if i != j || r != round {
            return Err(format!(
                "receiver {j} (QP {:#x}) completed sender {i}'s round {r} in round {round}",
                wc.qp_num
            ));
        }
        if wc.byte_len as usize != a.size {
            return Err(format!("byte_len {} != {}", wc.byte_len, a.size));
        }
        let mut buf = vec![0u8; a.size];
        let at = match a.op {
            Op::SendImm => wc.wr_id as usize * a.size,
            _ => (j * SLOTS + (r as usize % SLOTS)) * a.size,
        };
        let mr = if a.op == Op::SendImm {
            &self.bufs
        } else {
            &self.ring
        };
        mr.read_at(at, &mut buf).map_err(|e| e.to_string())?;
        let seq = (j as u64) << 32 | r;
        if let Some(k) = first_mismatch(&buf, seq) {
            return Err(format!("receiver {j} round {r}: payload byte {k} differs"));
        }
        self.got[j] += 1;
        self.checked += 1;
        Ok(())
    }
}

/// Polls `cq` into `wcs` until `want` completions arrived (checked by `each`) or the timeout.
fn drain(
    cq: &CompletionQueue,
    want: usize,
    a: &Args,
    mut each: impl FnMut(&WorkCompletion) -> Result<()>,
) -> Result<usize> {
    let mut wcs = vec![WorkCompletion::default(); 64];
    let mut got = 0usize;
    let start = Instant::now();
    while got < want {
        let n = cq.poll(&mut wcs);
        for wc in wcs.iter().take(n) {
            each(wc)?;
        }
        got += n;
        if n == 0 {
            if start.elapsed() > a.timeout {
                return Err(format!("{got} of {want} completions after {:?}", a.timeout));
            }
            std::thread::yield_now();
        }
    }
    Ok(got)
}

/// See the module docs.
pub(super) fn run(a: &Args) -> Result<String> {
    if !matches!(a.op, Op::SendImm | Op::WriteImm) {
        return Err("srq-many takes --op send-imm or write-imm".to_owned());
    }
    let n = a.qps;
    // The immediate holds the sender's index in 8 bits; a round must fit the SRQ.
    if n == 0 || n > 255 {
        return Err(format!("--qps {n}: 1..=255"));
    }
    let side = open(a)?;
    let (dev, pd) = (&side.device, &side.pd);
    let cq_depth = u32::try_from(n * SQ_WRS as usize * 2).unwrap_or(u32::MAX);
    let tx_send_cq = dev.create_cq(cq_depth).map_err(ctx("create_cq"))?;
    let tx_recv_cq = dev.create_cq(16).map_err(ctx("create_cq"))?;
    let rx_send_cq = dev.create_cq(16).map_err(ctx("create_cq"))?;
    let rx_cq = dev.create_cq(SRQ_WRS * 2).map_err(ctx("create_cq"))?;
    let srq = pd.create_srq(SRQ_WRS).map_err(ctx("create_srq"))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ring = pd
        .reg_mr(n * SLOTS * a.size, access)
        .map_err(ctx("reg_mr ring"))?;
    let bufs = pd
        .reg_mr(SRQ_WRS as usize * a.size, AccessFlags::LOCAL_WRITE)
        .map_err(ctx("reg_mr buffers"))?;
    let src = pd
        .reg_mr(n * a.size, AccessFlags::LOCAL_WRITE)
        .map_err(ctx("reg_mr source"))?;
    let attr = |send_cq, recv_cq| QpInitAttr {
        qp_type: QpType::Uc,
        send_cq,
        recv_cq,
        max_send_wr: SQ_WRS,
        max_recv_wr: 1,
        access,
        max_mtu: None,
    };
    let mut rx = Rx {
        srq: srq.clone(),
        qps: Vec::with_capacity(n),
        ring,
        bufs,
        got: vec![0; n],
        unknown_qpn: 0,
        checked: 0,
    };
    let mut tx = Vec::with_capacity(n);
    for _ in 0..n {
        let r = pd
            .create_qp_with_srq(&attr(&rx_send_cq, &rx_cq), &srq)
            .map_err(ctx("create_qp_with_srq (UC)"))?;
        let t = pd
            .create_qp(&QpInitAttr {
                max_recv_wr: 1,
                ..attr(&tx_send_cq, &tx_recv_cq)
            })
            .map_err(ctx("create_qp"))?;
        r.connect(&t.local_endpoint()).map_err(ctx("connect"))?;
        t.connect(&r.local_endpoint()).map_err(ctx("connect"))?;
        rx.qps.push(r);
        tx.push(t);
    }
    // A QP on the SRQ has no receive queue of its own.
    if rx.qps[0].post_recv(&[RecvWr::zero_length(0)]).is_ok() {
        return Err("post_recv on a QP of the SRQ was accepted".to_owned());
    }
    rx.post(a.op, a.size, 0, SRQ_WRS)?;
    let mut posted = u64::from(SRQ_WRS);
    let started = Instant::now();
    for round in 0..a.count {
        send_round(a, &tx, &src, &rx.ring, round)?;
        let got = drain(&rx_cq, n, a, |wc| rx.check(a, wc, round));
        let got = got.map_err(|x| format!("round {round}: {x}"))?;
        drain(&tx_send_cq, n, a, |wc| {
            (wc.status == WcStatus::Success)
                .then_some(())
                .ok_or_else(|| format!("send completion {:?}", wc.status))
        })?;
        rx.post(a.op, a.size, posted, got as u32)?;
        posted += got as u64;
        if let Some(ev) = dev.poll_async_event() {
            return Err(format!("round {round}: async event {ev:?}"));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if let Some((j, g)) = rx.got.iter().enumerate().find(|(_, g)| **g != a.count) {
        return Err(format!("receiver {j} got {g} of {} messages", a.count));
    }

    // The limit event: the SRQ holds SRQ_WRS WRs; arm the limit a little below, then one more
    // round without re-posting takes it under. The soft transport raises no SRQ events.
    let limit = SRQ_WRS - LIMIT_MARGIN;
    let handle = srq.handle();
    let armed = srq.arm_limit(limit);
    if !armed && a.transport != TransportKind::Soft {
        return Err(format!("arming the SRQ limit at {limit} failed"));
    }
    send_round(a, &tx, &src, &rx.ring, a.count)?;
    drain(&rx_cq, n, a, |wc| rx.check(a, wc, a.count))?;
    drain(&tx_send_cq, n, a, |_| Ok(()))?;
    let is_limit =
        |e: &AsyncEvent| matches!(e, AsyncEvent::SrqLimitReached { srq } if *srq == handle);
    let events = if armed {
        super::collect_events(dev, a.timeout, |seen| seen.iter().any(is_limit))
    } else {
        Vec::new()
    };
    let limit_events = events.iter().filter(|e| is_limit(e)).count();
    let summary = format!(
        "role=srq-many op={} qps={n} rounds={} received={} checked={} unknown_qpn={} \
         srq={handle} srq_max_wr={} rx_cq={} tx_cq={} limit_armed={armed} \
         limit_events={limit_events} other_events={} secs={secs:.2}",
        a.op.name(),
        a.count + 1,
        rx.got.iter().sum::<u64>(),
        rx.checked,
        rx.unknown_qpn,
        srq.max_wr(),
        rx_cq.handle(),
        tx_send_cq.handle(),
        events.len() - limit_events,
    );
    if armed && (limit_events != 1 || events.len() != 1) {
        return Err(format!("{summary}: want exactly one SRQ limit event"));
    }
    if rx.got.iter().any(|g| *g != a.count + 1) {
        return Err(format!("{summary}: a receiver missed a message"));
    }
    // Teardown: QPs, then the SRQ, then (with `side`) the PD.
    drop(tx);
    drop(rx);
    drop(srq);
    Ok(summary)
}

/// Posts sender `i`'s message of round `round` on every sender, signaled.
fn send_round(
    a: &Args,
    tx: &[QueuePair],
    src: &MemoryRegion,
    ring: &MemoryRegion,
    round: u64,
) -> Result<()> {
    let mut buf = vec![0u8; a.size];
    for (i, qp) in tx.iter().enumerate() {
        let seq = (i as u64) << 32 | round;
        fill(&mut buf, seq);
        debug_assert!(buf.len() >= SEQ_BYTES);
        src.write_at(i * a.size, &buf).map_err(|e| e.to_string())?;
        let sge = Some(Sge::new(src, i * a.size, a.size as u32));
        let imm = imm_of(i, round);
        let wr = match a.op {
            Op::SendImm => SendWr::send_with_imm(round, sge, imm),
            _ => {
                let slot = (i * SLOTS + (round as usize % SLOTS)) * a.size;
                SendWr::write_with_imm(round, sge, ring.addr() + slot as u64, ring.rkey(), imm)
            }
        };
        qp.post_send(&[wr])
            .map_err(|e| format!("sender {i}: {e}"))?;
    }
    Ok(())
}
