//! Values of `libibverbs/verbs.h` enums the transport passes or reads, and their mapping to
//! the API's types. Constants rather than the `rdma-sys` enums, so that a value a newer kernel
//! adds reads as "unknown" instead of being undefined behaviour in a Rust enum.

use crate::api::{AccessFlags, Mtu, QpState, WcOpcode, WcStatus};

/// `IBV_GID_TYPE_ROCE_V2` (verbs.h `enum ibv_gid_type`).
pub(super) const GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(super) const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_PORT_ACTIVE`.
pub(super) const PORT_ACTIVE: u32 = 4;

/// `enum ibv_wr_opcode` values (verbs.h).
pub(super) mod wr_opcode {
    pub(in crate::verbs) const RDMA_WRITE: u32 = 0;
    pub(in crate::verbs) const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub(in crate::verbs) const SEND: u32 = 2;
    pub(in crate::verbs) const SEND_WITH_IMM: u32 = 3;
}

/// `enum ibv_wc_opcode` values (verbs.h).
pub(super) mod wc_opcode {
    pub(in crate::verbs) const SEND: u32 = 0;
    pub(in crate::verbs) const RDMA_WRITE: u32 = 1;
    pub(in crate::verbs) const RECV: u32 = 128;
    pub(in crate::verbs) const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_status` values (verbs.h).
pub(super) mod wc_status {
    pub(in crate::verbs) const SUCCESS: u32 = 0;
    pub(in crate::verbs) const LOC_LEN_ERR: u32 = 1;
    pub(in crate::verbs) const LOC_QP_OP_ERR: u32 = 2;
    pub(in crate::verbs) const LOC_PROT_ERR: u32 = 4;
    pub(in crate::verbs) const WR_FLUSH_ERR: u32 = 5;
    pub(in crate::verbs) const REM_INV_REQ_ERR: u32 = 9;
    pub(in crate::verbs) const REM_ACCESS_ERR: u32 = 10;
    pub(in crate::verbs) const REM_OP_ERR: u32 = 11;
    pub(in crate::verbs) const RETRY_EXC_ERR: u32 = 12;
    pub(in crate::verbs) const RNR_RETRY_EXC_ERR: u32 = 13;
}

/// `enum ibv_qp_attr_mask` bits (verbs.h) and the masks of the state transitions this
/// transport drives, as the table of ibv_modify_qp(3) requires them per QP type (IBTA Vol. 1
/// §10.3 / §11.2.5, "Modify QP": required attributes per transition and service).
pub(super) mod qp_mask {
    use rdma_sys::ibv_qp_attr_mask as M;
    pub(in crate::verbs) const STATE: u32 = M::IBV_QP_STATE.0;
    pub(in crate::verbs) const ACCESS_FLAGS: u32 = M::IBV_QP_ACCESS_FLAGS.0;
    pub(in crate::verbs) const PKEY_INDEX: u32 = M::IBV_QP_PKEY_INDEX.0;
    pub(in crate::verbs) const PORT: u32 = M::IBV_QP_PORT.0;
    pub(in crate::verbs) const AV: u32 = M::IBV_QP_AV.0;
    pub(in crate::verbs) const PATH_MTU: u32 = M::IBV_QP_PATH_MTU.0;
    pub(in crate::verbs) const TIMEOUT: u32 = M::IBV_QP_TIMEOUT.0;
    pub(in crate::verbs) const RETRY_CNT: u32 = M::IBV_QP_RETRY_CNT.0;
    pub(in crate::verbs) const RNR_RETRY: u32 = M::IBV_QP_RNR_RETRY.0;
    pub(in crate::verbs) const RQ_PSN: u32 = M::IBV_QP_RQ_PSN.0;
    pub(in crate::verbs) const MAX_QP_RD_ATOMIC: u32 = M::IBV_QP_MAX_QP_RD_ATOMIC.0;
    pub(in crate::verbs) const MIN_RNR_TIMER: u32 = M::IBV_QP_MIN_RNR_TIMER.0;
    pub(in crate::verbs) const SQ_PSN: u32 = M::IBV_QP_SQ_PSN.0;
    pub(in crate::verbs) const MAX_DEST_RD_ATOMIC: u32 = M::IBV_QP_MAX_DEST_RD_ATOMIC.0;
    pub(in crate::verbs) const DEST_QPN: u32 = M::IBV_QP_DEST_QPN.0;

    /// RESET → INIT, UC and RC alike (ibv_modify_qp(3): RC needs no more in INIT; the
    /// READ/atomic access bits would go into ACCESS_FLAGS, which uctel does not use).
    pub(in crate::verbs) const INIT: u32 = STATE | PKEY_INDEX | PORT | ACCESS_FLAGS;
    /// INIT → RTR for UC: 0x101181.
    pub(in crate::verbs) const RTR: u32 = STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN;
    /// RTR → RTS for UC: 0x10001.
    pub(in crate::verbs) const RTS: u32 = STATE | SQ_PSN;
    /// INIT → RTR for RC: the UC mask plus the responder's READ/atomic depth and the RNR NAK
    /// timer it announces, 0x129181 (as `ibv_rc_pingpong` and perftest set it).
    pub(in crate::verbs) const RTR_RC: u32 = RTR | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER;
    /// RTR → RTS for RC: the UC mask plus the requester's ACK timeout, retry counts and
    /// READ/atomic depth, 0x12e01.
    pub(in crate::verbs) const RTS_RC: u32 =
        RTS | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC;

    /// Names of the bits set in `mask`, for error messages (`STATE|AV|PATH_MTU|…`).
    pub(in crate::verbs) fn names(mask: u32) -> String {
        let all = [
            (STATE, "STATE"),
            (ACCESS_FLAGS, "ACCESS_FLAGS"),
            (PKEY_INDEX, "PKEY_INDEX"),
            (PORT, "PORT"),
            (AV, "AV"),
            (PATH_MTU, "PATH_MTU"),
            (TIMEOUT, "TIMEOUT"),
            (RETRY_CNT, "RETRY_CNT"),
            (RNR_RETRY, "RNR_RETRY"),
            (RQ_PSN, "RQ_PSN"),
            (MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
            (MIN_RNR_TIMER, "MIN_RNR_TIMER"),
            (SQ_PSN, "SQ_PSN"),
            (MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
            (DEST_QPN, "DEST_QPN"),
        ];
        let v: Vec<&str> = all
            .iter()
            .filter(|(b, _)| mask & b != 0)
            .map(|(_, n)| *n)
            .collect();
        v.join("|")
    }
}

/// The IB MTU of an `enum ibv_mtu` value.
pub(super) fn mtu_from_ibv(v: u32) -> Option<Mtu> {
    match v {
        1 => Some(Mtu::Mtu256),
        2 => Some(Mtu::Mtu512),
        3 => Some(Mtu::Mtu1024),
        4 => Some(Mtu::Mtu2048),
        5 => Some(Mtu::Mtu4096),
        _ => None,
    }
}

/// The `enum ibv_mtu` value of an IB MTU.
pub(super) fn mtu_to_ibv(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

/// `ibv_access_flags` bits of the API's access flags (same values by construction).
pub(super) fn access_bits(a: AccessFlags) -> u32 {
    a.bits()
}

pub(super) fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Error => 6,
    }
}

pub(super) fn state_from_code(c: u32) -> QpState {
    match c {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        // SQD is never requested here; SQE (a UC send queue error, 5) reads as ERROR: the QP
        // sends no more until it is rebuilt. RC goes to ERROR directly.
        _ => QpState::Error,
    }
}

pub(super) fn wc_status(v: u32) -> WcStatus {
    match v {
        wc_status::SUCCESS => WcStatus::Success,
        wc_status::LOC_LEN_ERR => WcStatus::LocalLengthError,
        wc_status::LOC_QP_OP_ERR => WcStatus::LocalQpOperationError,
        wc_status::LOC_PROT_ERR => WcStatus::LocalProtectionError,
        wc_status::WR_FLUSH_ERR => WcStatus::WrFlushError,
        wc_status::REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequestError,
        wc_status::REM_ACCESS_ERR => WcStatus::RemoteAccessError,
        wc_status::REM_OP_ERR => WcStatus::RemoteOperationError,
        wc_status::RETRY_EXC_ERR => WcStatus::RetryExceededError,
        wc_status::RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExceededError,
        _ => WcStatus::GeneralError,
    }
}

pub(super) fn wc_opcode(v: u32) -> WcOpcode {
    match v {
        wc_opcode::SEND => WcOpcode::Send,
        wc_opcode::RDMA_WRITE => WcOpcode::RdmaWrite,
        wc_opcode::RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        wc_opcode::RECV => WcOpcode::Recv,
        // Nothing else is produced by a UC or RC QP that issues no READ or atomic; error
        // completions leave the opcode undefined
        // (ibv_poll_cq(3)), where only wr_id, status and qp_num count.
        _ => WcOpcode::Recv,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_round_trip() {
        for m in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(mtu_from_ibv(mtu_to_ibv(m)), Some(m));
        }
        assert_eq!(mtu_from_ibv(0), None);
        assert_eq!(mtu_from_ibv(6), None);
    }

    #[test]
    fn attribute_masks_match_the_ibv_modify_qp_table() {
        // UC as perftest sets them: RTR 0x101181, RTS 0x10001.
        assert_eq!(qp_mask::RTR, 0x10_1181);
        assert_eq!(qp_mask::RTS, 0x1_0001);
        assert_eq!(qp_mask::INIT, 0x1 | 0x10 | 0x20 | 0x8);
        // RC as ibv_rc_pingpong and perftest set them: RTR 0x129181, RTS 0x12e01.
        assert_eq!(qp_mask::RTR_RC, 0x12_9181);
        assert_eq!(qp_mask::RTS_RC, 0x1_2e01);
        assert_eq!(qp_mask::names(qp_mask::RTS), "STATE|SQ_PSN");
        assert_eq!(
            qp_mask::names(qp_mask::RTS_RC),
            "STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN"
        );
        assert_eq!(
            qp_mask::names(qp_mask::RTR_RC),
            "STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN"
        );
    }

    #[test]
    fn completion_codes_map_to_the_api() {
        assert_eq!(wc_status(0), WcStatus::Success);
        assert_eq!(wc_status(5), WcStatus::WrFlushError);
        assert_eq!(wc_status(12), WcStatus::RetryExceededError);
        assert_eq!(wc_status(13), WcStatus::RnrRetryExceededError);
        assert_eq!(wc_status(7), WcStatus::GeneralError, "IBV_WC_BAD_RESP_ERR");
        assert_eq!(wc_opcode(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc_opcode(128), WcOpcode::Recv);
        assert_eq!(wc_opcode(1), WcOpcode::RdmaWrite);
    }
}
