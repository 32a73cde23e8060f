//! One engine per soft QP, by transport service ([`QpEngine`]): the UC engine
//! ([`UcQp`]) or the RC engine ([`RcQp`]) behind the calls the device makes, and the parse
//! of an inbound packet by the transport bits of its BTH opcode ([`ParsedPacket`]).
//!
//! The RC engine is the only one with timers and the only one whose send completions come
//! from the receive path (ACKs); the UC calls ignore `now`.

use std::time::Instant;

use crate::api::{AccessFlags, QpErrorCause, QpState, QpStats, QpType, RcAttr, UcDropReason};
use crate::soft::engine::{
    CompletionSink, ModifyError, PostRefusal, RecvRefusal, RecvWqe, RtrAttr, SendWqe, UcQp,
    UcQpConfig,
};
use crate::soft::memory::MemoryTable;
use crate::soft::packet::{PacketError, PacketRepr, RcPacketRepr};
use crate::soft::rc::{RcQp, RcQpConfig, RcRtrAttr, RcRtsAttr};

/// Transport bits (the top 3 bits of the BTH opcode, IBTA 9.2.1) of RC.
const TRANSPORT_RC: u8 = 0b000;

/// An inbound packet parsed by the service its opcode names.
#[derive(Clone, Copy, Debug)]
pub(super) enum ParsedPacket<'a> {
    /// A UC opcode.
    Uc(PacketRepr<'a>),
    /// An RC opcode (request or ACKNOWLEDGE).
    Rc(RcPacketRepr<'a>),
}

impl<'a> ParsedPacket<'a> {
    /// Parses one UDP payload: RC opcodes (transport bits `000`) with the RC parser, anything
    /// else with the UC parser (which refuses what is not UC).
    pub(super) fn parse(udp_payload: &'a [u8]) -> Result<Self, PacketError> {
        match udp_payload.first() {
            Some(op) if op >> 5 == TRANSPORT_RC => RcPacketRepr::parse(udp_payload).map(Self::Rc),
            _ => PacketRepr::parse(udp_payload).map(Self::Uc),
        }
    }

    /// The BTH destination QPN.
    pub(super) fn dest_qpn(&self) -> u32 {
        match self {
            Self::Uc(p) => p.bth.dest_qpn,
            Self::Rc(p) => p.bth.dest_qpn,
        }
    }
}

/// The engine of one soft QP. UC, the hot path, stays inline; RC is boxed.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(super) enum QpEngine {
    Uc(UcQp),
    Rc { engine: Box<RcQp>, attr: RcAttr },
}

impl QpEngine {
    /// A new engine in RESET for `qp_type`.
    pub(super) fn new(qp_type: QpType, qpn: u32, max_send_wr: u32, max_recv_wr: u32) -> Self {
        match qp_type {
            QpType::Uc => Self::Uc(UcQp::new(UcQpConfig {
                qpn,
                max_send_wr,
                max_recv_wr,
            })),
            QpType::Rc(attr) => Self::Rc {
                engine: Box::new(RcQp::new(RcQpConfig {
                    qpn,
                    max_send_wr,
                    max_recv_wr,
                })),
                attr,
            },
        }
    }

    pub(super) fn qp_type(&self) -> QpType {
        match self {
            Self::Uc(_) => QpType::Uc,
            Self::Rc { attr, .. } => QpType::Rc(*attr),
        }
    }

    pub(super) fn is_rc(&self) -> bool {
        matches!(self, Self::Rc { .. })
    }

    pub(super) fn state(&self) -> QpState {
        match self {
            Self::Uc(e) => e.state(),
            Self::Rc { engine, .. } => engine.state(),
        }
    }

    pub(super) fn modify_to_init(&mut self, access: AccessFlags) -> Result<(), ModifyError> {
        match self {
            Self::Uc(e) => e.modify_to_init(access),
            Self::Rc { engine, .. } => engine.modify_to_init(access),
        }
    }

    /// INIT → RTR → RTS; an RC engine takes its [`RcAttr`] too.
    pub(super) fn connect(
        &mut self,
        rtr: RtrAttr,
        sq_psn: u32,
    ) -> Result<(), (QpState, ModifyError)> {
        match self {
            Self::Uc(e) => {
                e.modify_to_rtr(rtr).map_err(|e| (QpState::Rtr, e))?;
                e.modify_to_rts(sq_psn).map_err(|e| (QpState::Rts, e))
            }
            Self::Rc { engine, attr } => {
                engine
                    .modify_to_rtr(RcRtrAttr {
                        dest_qpn: rtr.dest_qpn,
                        rq_psn: rtr.rq_psn,
                        path_mtu: rtr.path_mtu,
                        min_rnr_timer: attr.min_rnr_timer,
                    })
                    .map_err(|e| (QpState::Rtr, e))?;
                engine
                    .modify_to_rts(RcRtsAttr {
                        sq_psn,
                        timeout: attr.timeout,
                        retry_cnt: attr.retry_cnt,
                        rnr_retry: attr.rnr_retry,
                    })
                    .map_err(|e| (QpState::Rts, e))
            }
        }
    }

    pub(super) fn modify_to_error(&mut self) {
        match self {
            Self::Uc(e) => e.modify_to_error(),
            Self::Rc { engine, .. } => engine.modify_to_error(),
        }
    }

    pub(super) fn post_send(&mut self, wqe: SendWqe) -> Result<(), PostRefusal> {
        match self {
            Self::Uc(e) => e.post_send(wqe),
            Self::Rc { engine, .. } => engine.post_send(wqe),
        }
    }

    pub(super) fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), RecvRefusal> {
        match self {
            Self::Uc(e) => e.post_recv(wqe),
            Self::Rc { engine, .. } => engine.post_recv(wqe),
        }
    }

    pub(super) fn flush(
        &mut self,
        scq: &mut dyn CompletionSink,
        rcq: &mut dyn CompletionSink,
    ) -> bool {
        match self {
            Self::Uc(e) => e.flush(scq, rcq),
            Self::Rc { engine, .. } => engine.flush(scq, rcq),
        }
    }

    pub(super) fn needs_flush(&self) -> bool {
        match self {
            Self::Uc(e) => e.needs_flush(),
            Self::Rc { engine, .. } => engine.needs_flush(),
        }
    }

    pub(super) fn wants_transmit(&self) -> bool {
        match self {
            Self::Uc(e) => e.wants_transmit(),
            Self::Rc { engine, .. } => engine.wants_transmit(),
        }
    }

    /// Builds the next outbound packet into `out`; `false` when there is none. UC send WRs
    /// complete into `scq` here (on the wire); RC ones complete when ACKed, in
    /// [`QpEngine::receive`].
    pub(super) fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn MemoryTable,
        out: &mut Vec<u8>,
        scq: &mut dyn CompletionSink,
    ) -> bool {
        match self {
            Self::Uc(e) => e.poll_transmit(mem, out, scq).is_some(),
            Self::Rc { engine, .. } => engine.poll_transmit(now, mem, out).is_some(),
        }
    }

    /// Processes one inbound packet. A packet of the other service is dropped as `malformed`
    /// (rxe `check_type_state`). Returns whether the QP's counters that a poller folds may
    /// have changed: a drop counted on a UC QP, any packet of an RC QP (its retransmission
    /// counters), a packet of the wrong service.
    pub(super) fn receive(
        &mut self,
        now: Instant,
        pkt: &ParsedPacket<'_>,
        mem: &dyn MemoryTable,
        scq: &mut dyn CompletionSink,
        rcq: &mut dyn CompletionSink,
    ) -> bool {
        match (self, pkt) {
            (Self::Uc(e), ParsedPacket::Uc(p)) => {
                let before = e.drops_total();
                e.receive(p, mem, rcq);
                e.drops_total() != before
            }
            (Self::Rc { engine, .. }, ParsedPacket::Rc(p)) => {
                engine.receive(now, p, mem, scq, rcq);
                true
            }
            (e, _) => {
                e.count_drop(UcDropReason::Malformed);
                true
            }
        }
    }

    /// Takes receive WRs from `srq` (see [`crate::api::SharedReceiveQueue`]).
    pub(super) fn use_srq(&mut self, srq: std::sync::Arc<crate::soft::qp::SrqQueue>) {
        match self {
            Self::Uc(e) => e.use_srq(srq),
            Self::Rc { engine, .. } => engine.use_srq(srq),
        }
    }

    pub(super) fn count_drop(&mut self, reason: UcDropReason) {
        match self {
            Self::Uc(e) => e.count_drop(reason),
            Self::Rc { engine, .. } => engine.count_drop(reason),
        }
    }

    /// When the engine needs [`QpEngine::handle_timeout`] (RC timers; never for UC).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Self::Uc(_) => None,
            Self::Rc { engine, .. } => engine.poll_timeout(),
        }
    }

    pub(super) fn handle_timeout(&mut self, now: Instant) {
        if let Self::Rc { engine, .. } = self {
            engine.handle_timeout(now);
        }
    }

    pub(super) fn stats(&self) -> QpStats {
        match self {
            Self::Uc(e) => e.stats(),
            Self::Rc { engine, .. } => engine.stats().qp_stats(),
        }
    }

    pub(super) fn take_error_event(&mut self) -> Option<QpErrorCause> {
        match self {
            Self::Uc(e) => e.take_error_event(),
            Self::Rc { engine, .. } => engine.take_error_event(),
        }
    }

    pub(super) fn take_cq_overflow(&mut self) -> bool {
        match self {
            Self::Uc(e) => e.take_cq_overflow(),
            Self::Rc { engine, .. } => engine.take_cq_overflow(),
        }
    }
}
