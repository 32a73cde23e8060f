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
        // SQD and SQE are not used by UC here; SQE is an error state of the send queue.
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
        // Nothing else is produced by a UC QP; error completions leave the opcode undefined
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
