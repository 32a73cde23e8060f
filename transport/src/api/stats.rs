//! Drop accounting: the closed set of [`UcDropReason`]s, [`DropCounters`] by reason, and the
//! per-QP and per-device counters ([`QpStats`], [`DeviceStats`]).

use std::fmt;

/// Why the responder silently discarded an inbound message or packet. One closed set for every
/// transport; [`UcDropReason::as_str`] gives the Prometheus label value.
///
/// Units: reasons counted by a QP ([`QpStats::drops`]) count **messages** (each message is
/// counted at most once, at the first packet that dooms it; the rest of a doomed message is
/// discarded and counted in [`QpStats::packets_discarded`]). Reasons counted by the device
/// before a QP is known ([`DeviceStats::drops`]: `malformed`, `bad_icrc`, `unknown_qpn`) count
/// **packets**. With uctel's one-packet frames both units are frames, so
/// `sent = completed + dropped + lost on the wire` holds exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UcDropReason {
    /// The UDP payload is not a well-formed RoCEv2 packet (too short, wrong BTH version, an
    /// opcode that is neither UC nor a supported RC one, bad pad count, longer than the soft
    /// link's receive buffer). Device level; also counted by a QP for a packet of the other
    /// transport service (an RC opcode to a UC QP or the reverse; rxe `check_type_state`).
    Malformed,
    /// The ICRC does not match (IBTA annex A17; rxe `rxe_icrc_check`). Device level.
    BadIcrc,
    /// No QP with the BTH destination QPN exists on this device. Device level.
    UnknownQpn,
    /// BTH P_Key does not match the default partition (rxe `check_keys`).
    BadPkey,
    /// The source IP is not the connected peer's (rxe `check_addr` for RC/UC).
    AddressMismatch,
    /// The QP is in RESET or INIT (rxe `hdr_check`: QP not ready).
    QpNotReady,
    /// The QP is in ERROR.
    QpError,
    /// A MIDDLE/LAST packet whose PSN is not the expected one: an earlier packet of its message
    /// was lost, so the whole message is dropped (rxe `check_psn`, UC case).
    PsnGap,
    /// A MIDDLE/LAST packet with the expected PSN that does not continue the message in
    /// progress (rxe `check_op_seq`, UC case).
    OpcodeSequence,
    /// A partially received message was cut short by a new FIRST/ONLY packet (its LAST was
    /// lost); the partial message is discarded and its receive WR reused (IBTA class D1, rxe
    /// `do_class_d1e_error`).
    CutShort,
    /// SEND or WRITE_WITH_IMM with no receive WR posted (no RNR NAK on UC; rxe `RESPST_ERR_RNR`
    /// "UD/UC – class D").
    NoReceiveWr,
    /// RETH rkey matches no MR on this device (rxe `check_rkey`).
    BadRkey,
    /// RETH virtual address + DMA length is not inside the MR (rxe `mr_check_range`).
    OutOfBounds,
    /// The QP or the target MR lacks REMOTE_WRITE (rxe `check_op_valid` / `lookup_mr`).
    AccessDenied,
    /// A packet's payload length is inconsistent with the path MTU or the RETH DMA length
    /// (rxe `check_length` / `check_rkey`, class D).
    BadLength,
    /// An inbound SEND is longer than the posted receive buffer. rxe completes the receive WR
    /// with `IBV_WC_LOC_QP_OP_ERR` and moves the QP to ERROR (`copy_data` returns `-EINVAL` →
    /// `RESPST_ERR_MALFORMED_WQE`, class A); the soft transport does the same.
    MessageTooLong,
    /// The receive WR's buffer is no longer usable (its MR was deregistered or lacks
    /// LOCAL_WRITE); completed with `IBV_WC_LOC_QP_OP_ERR`, QP to ERROR (rxe class A).
    BadReceiveWr,
    /// The receive CQ was full when the message completed: the completion is lost and the QP
    /// moves to ERROR (IBTA class G; rxe `RESPST_ERR_CQ_OVERFLOW`).
    CqOverflow,
}

impl UcDropReason {
    /// Number of reasons.
    pub const COUNT: usize = 18;

    /// Every reason, in declaration order.
    pub const ALL: [Self; Self::COUNT] = [
        Self::Malformed,
        Self::BadIcrc,
        Self::UnknownQpn,
        Self::BadPkey,
        Self::AddressMismatch,
        Self::QpNotReady,
        Self::QpError,
        Self::PsnGap,
        Self::OpcodeSequence,
        Self::CutShort,
        Self::NoReceiveWr,
        Self::BadRkey,
        Self::OutOfBounds,
        Self::AccessDenied,
        Self::BadLength,
        Self::MessageTooLong,
        Self::BadReceiveWr,
        Self::CqOverflow,
    ];

    /// Snake-case name, stable, for the `reason` label of drop counters.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::BadIcrc => "bad_icrc",
            Self::UnknownQpn => "unknown_qpn",
            Self::BadPkey => "bad_pkey",
            Self::AddressMismatch => "address_mismatch",
            Self::QpNotReady => "qp_not_ready",
            Self::QpError => "qp_error",
            Self::PsnGap => "psn_gap",
            Self::OpcodeSequence => "opcode_sequence",
            Self::CutShort => "cut_short",
            Self::NoReceiveWr => "no_receive_wr",
            Self::BadRkey => "bad_rkey",
            Self::OutOfBounds => "out_of_bounds",
            Self::AccessDenied => "access_denied",
            Self::BadLength => "bad_length",
            Self::MessageTooLong => "message_too_long",
            Self::BadReceiveWr => "bad_receive_wr",
            Self::CqOverflow => "cq_overflow",
        }
    }

    /// Index into [`DropCounters`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for UcDropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One counter per [`UcDropReason`].
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct DropCounters([u64; UcDropReason::COUNT]);

impl DropCounters {
    /// Adds one to `reason`.
    pub fn inc(&mut self, reason: UcDropReason) {
        self.add(reason, 1);
    }

    /// Adds `n` to `reason`.
    pub fn add(&mut self, reason: UcDropReason, n: u64) {
        if let Some(c) = self.0.get_mut(reason.index()) {
            *c = c.saturating_add(n);
        }
    }

    /// The count for `reason`.
    pub fn get(&self, reason: UcDropReason) -> u64 {
        self.0.get(reason.index()).copied().unwrap_or(0)
    }

    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// `(reason, count)` for every reason, including zeros.
    pub fn iter(&self) -> impl Iterator<Item = (UcDropReason, u64)> + '_ {
        UcDropReason::ALL.iter().map(|r| (*r, self.get(*r)))
    }

    /// Element-wise sum.
    pub fn merged(mut self, other: &DropCounters) -> DropCounters {
        for r in UcDropReason::ALL {
            self.add(r, other.get(r));
        }
        self
    }
}

impl fmt::Debug for DropCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.iter()
                    .filter(|(_, n)| *n != 0)
                    .map(|(r, n)| (r.as_str(), n)),
            )
            .finish()
    }
}

/// Per-QP counters ([`QueuePair::stats`](super::QueuePair::stats)). All monotonic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpStats {
    /// Packets handed to the wire.
    pub packets_sent: u64,
    /// Send WRs whose last packet was handed to the wire.
    pub messages_sent: u64,
    /// Inbound packets that reached this QP.
    pub packets_received: u64,
    /// Inbound messages that completed (placed, and a receive WC posted when one is due).
    pub messages_completed: u64,
    /// FIRST/ONLY packets accepted with a PSN other than the expected one (the responder
    /// resynchronised; the skipped PSNs were lost on the wire or belonged to dropped messages).
    pub psn_resyncs: u64,
    /// Inbound packets discarded because their message was already dropped (the rest of a
    /// message counted once in `drops`).
    pub packets_discarded: u64,
    /// Dropped inbound messages by reason.
    pub drops: DropCounters,
    /// RC only (all 0 on UC, and on the verbs transport, whose devices count these per port,
    /// not per QP): retransmissions, timers and NAKs.
    pub rc: RcCounters,
}

/// What an RC QP did to deliver (IBTA 9.7; rxe's `hw_counters` name the same events per
/// port). All monotonic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RcCounters {
    /// Request packets sent again after a timeout, a sequence NAK or an RNR NAK.
    pub packets_retransmitted: u64,
    /// Retransmit timer expiries with packets outstanding (rxe counts these and
    /// sequence-NAK retries together in `completer_retry_err`).
    pub timeouts: u64,
    /// NAKs sent as responder, all codes (PSN sequence error: rxe `out_of_seq_request`).
    pub naks_sent: u64,
    /// NAKs received as requester, all codes (rxe `rcvd_seq_err` for sequence NAKs).
    pub naks_received: u64,
    /// RNR NAKs sent (rxe `send_rnr_err`).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received (rxe `rcvd_rnr_err`).
    pub rnr_naks_received: u64,
    /// Send WRs failed because `retry_cnt` ran out (rxe `retry_exceeded_err`).
    pub retry_exceeded: u64,
    /// Send WRs failed because `rnr_retry` ran out (rxe `retry_rnr_exceeded_err`).
    pub rnr_retry_exceeded: u64,
    /// Inbound duplicate requests, re-acknowledged and not executed (rxe
    /// `duplicate_request`).
    pub duplicates: u64,
}

impl RcCounters {
    /// Label values of the counters, in [`RcCounters::iter`] order (the `event` label of
    /// the daemons' RC counter families).
    pub const NAMES: [&'static str; 9] = [
        "packets_retransmitted",
        "timeouts",
        "naks_sent",
        "naks_received",
        "rnr_naks_sent",
        "rnr_naks_received",
        "retry_exceeded",
        "rnr_retry_exceeded",
        "duplicates",
    ];

    /// What each counter grew by since `earlier` (0 where it did not: a new QP counts from
    /// zero).
    #[must_use]
    pub fn since(&self, earlier: &RcCounters) -> RcCounters {
        RcCounters {
            packets_retransmitted: self
                .packets_retransmitted
                .saturating_sub(earlier.packets_retransmitted),
            timeouts: self.timeouts.saturating_sub(earlier.timeouts),
            naks_sent: self.naks_sent.saturating_sub(earlier.naks_sent),
            naks_received: self.naks_received.saturating_sub(earlier.naks_received),
            rnr_naks_sent: self.rnr_naks_sent.saturating_sub(earlier.rnr_naks_sent),
            rnr_naks_received: self
                .rnr_naks_received
                .saturating_sub(earlier.rnr_naks_received),
            retry_exceeded: self.retry_exceeded.saturating_sub(earlier.retry_exceeded),
            rnr_retry_exceeded: self
                .rnr_retry_exceeded
                .saturating_sub(earlier.rnr_retry_exceeded),
            duplicates: self.duplicates.saturating_sub(earlier.duplicates),
        }
    }

    /// Every counter with its label value ([`RcCounters::NAMES`]).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let values = [
            self.packets_retransmitted,
            self.timeouts,
            self.naks_sent,
            self.naks_received,
            self.rnr_naks_sent,
            self.rnr_naks_received,
            self.retry_exceeded,
            self.rnr_retry_exceeded,
            self.duplicates,
        ];
        Self::NAMES.into_iter().zip(values)
    }
}

/// Device-wide counters ([`Device::stats`](super::Device::stats)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DeviceStats {
    /// Datagrams received from the link.
    pub packets_received: u64,
    /// Datagrams handed to the link.
    pub packets_sent: u64,
    /// Packets dropped before reaching a QP (`malformed`, `bad_icrc`, `unknown_qpn`).
    pub drops: DropCounters,
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_counter_names_follow_the_fields() {
        let c = RcCounters {
            packets_retransmitted: 1,
            timeouts: 2,
            naks_sent: 3,
            naks_received: 4,
            rnr_naks_sent: 5,
            rnr_naks_received: 6,
            retry_exceeded: 7,
            rnr_retry_exceeded: 8,
            duplicates: 9,
        };
        let got: Vec<(&str, u64)> = c.iter().collect();
        assert_eq!(got.len(), 9);
        for (i, (name, value)) in got.iter().enumerate() {
            assert_eq!(*name, RcCounters::NAMES[i]);
            assert_eq!(*value, i as u64 + 1, "{name}");
        }
        assert_eq!(got[6], ("retry_exceeded", 7));
        let later = RcCounters {
            timeouts: 5,
            duplicates: 1,
            ..c
        };
        let grown = later.since(&c);
        assert_eq!((grown.timeouts, grown.duplicates), (3, 0));
        assert_eq!(grown.iter().map(|(_, v)| v).sum::<u64>(), 3);
    }

    #[test]
    fn drop_reason_names_are_unique_label_values() {
        let mut names: Vec<&str> = UcDropReason::ALL.iter().map(|r| r.as_str()).collect();
        for n in &names {
            assert!(
                n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{n}"
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), UcDropReason::COUNT);
        for (i, r) in UcDropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn drop_counters_count_by_reason() {
        let mut c = DropCounters::default();
        c.inc(UcDropReason::PsnGap);
        c.add(UcDropReason::NoReceiveWr, 3);
        assert_eq!(c.get(UcDropReason::PsnGap), 1);
        assert_eq!(c.get(UcDropReason::NoReceiveWr), 3);
        assert_eq!(c.total(), 4);
        let m = c.merged(&c);
        assert_eq!(m.total(), 8);
    }
}
