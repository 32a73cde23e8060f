//! The opcode sets of the BTH (IBTA Vol 1 §9.2.1, table "OpCode field"): [`Opcode`] for the
//! Unreliable Connection transport and [`RcOpcode`] for the Reliable Connection subset uctel
//! speaks. Which extension headers follow the BTH is fixed by the opcode (§9.3).

use std::fmt;

use super::PacketError;
use super::{AETH_LEN, BTH_LEN, IMMDT_LEN, RETH_LEN};

/// The UC opcodes of IBTA Vol 1 §9.2.1 (table "OpCode field": transport `001` = UC), as rxe
/// defines them in `rxe_opcode.c` (`IB_OPCODE_UC_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    /// `UC_SEND_FIRST` (0x20): first packet of a multi-packet SEND.
    SendFirst = 0x20,
    /// `UC_SEND_MIDDLE` (0x21).
    SendMiddle = 0x21,
    /// `UC_SEND_LAST` (0x22).
    SendLast = 0x22,
    /// `UC_SEND_LAST_WITH_IMMEDIATE` (0x23): carries ImmDt.
    SendLastWithImmediate = 0x23,
    /// `UC_SEND_ONLY` (0x24): a whole SEND in one packet.
    SendOnly = 0x24,
    /// `UC_SEND_ONLY_WITH_IMMEDIATE` (0x25): carries ImmDt.
    SendOnlyWithImmediate = 0x25,
    /// `UC_RDMA_WRITE_FIRST` (0x26): carries RETH.
    RdmaWriteFirst = 0x26,
    /// `UC_RDMA_WRITE_MIDDLE` (0x27).
    RdmaWriteMiddle = 0x27,
    /// `UC_RDMA_WRITE_LAST` (0x28).
    RdmaWriteLast = 0x28,
    /// `UC_RDMA_WRITE_LAST_WITH_IMMEDIATE` (0x29): carries ImmDt.
    RdmaWriteLastWithImmediate = 0x29,
    /// `UC_RDMA_WRITE_ONLY` (0x2a): carries RETH.
    RdmaWriteOnly = 0x2a,
    /// `UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0x2b): carries RETH then ImmDt.
    RdmaWriteOnlyWithImmediate = 0x2b,
}

impl Opcode {
    /// All UC opcodes in wire order.
    pub const ALL: [Opcode; 12] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastWithImmediate,
        Opcode::SendOnly,
        Opcode::SendOnlyWithImmediate,
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteMiddle,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteLastWithImmediate,
        Opcode::RdmaWriteOnly,
        Opcode::RdmaWriteOnlyWithImmediate,
    ];

    /// The opcode for a wire byte, or `None` if it is not a UC opcode.
    pub const fn from_u8(byte: u8) -> Option<Opcode> {
        Some(match byte {
            0x20 => Opcode::SendFirst,
            0x21 => Opcode::SendMiddle,
            0x22 => Opcode::SendLast,
            0x23 => Opcode::SendLastWithImmediate,
            0x24 => Opcode::SendOnly,
            0x25 => Opcode::SendOnlyWithImmediate,
            0x26 => Opcode::RdmaWriteFirst,
            0x27 => Opcode::RdmaWriteMiddle,
            0x28 => Opcode::RdmaWriteLast,
            0x29 => Opcode::RdmaWriteLastWithImmediate,
            0x2a => Opcode::RdmaWriteOnly,
            0x2b => Opcode::RdmaWriteOnlyWithImmediate,
            _ => return None,
        })
    }

    /// The wire byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// A SEND opcode (channel semantics; consumes a receive WR).
    pub const fn is_send(self) -> bool {
        (self as u8) <= 0x25
    }

    /// An RDMA WRITE opcode (memory semantics).
    pub const fn is_write(self) -> bool {
        !self.is_send()
    }

    /// First packet of a multi-packet message.
    pub const fn is_first(self) -> bool {
        matches!(self, Opcode::SendFirst | Opcode::RdmaWriteFirst)
    }

    /// Middle packet of a multi-packet message.
    pub const fn is_middle(self) -> bool {
        matches!(self, Opcode::SendMiddle | Opcode::RdmaWriteMiddle)
    }

    /// Last packet of a multi-packet message.
    pub const fn is_last(self) -> bool {
        matches!(
            self,
            Opcode::SendLast
                | Opcode::SendLastWithImmediate
                | Opcode::RdmaWriteLast
                | Opcode::RdmaWriteLastWithImmediate
        )
    }

    /// The only packet of a single-packet message.
    pub const fn is_only(self) -> bool {
        matches!(
            self,
            Opcode::SendOnly
                | Opcode::SendOnlyWithImmediate
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
        )
    }

    /// Starts a message (FIRST or ONLY): the packets a UC responder resynchronises on
    /// (rxe `check_psn()`, `RXE_START_MASK`).
    pub const fn is_start(self) -> bool {
        self.is_first() || self.is_only()
    }

    /// Ends a message (LAST or ONLY): the packets that complete a WR (`RXE_END_MASK`).
    pub const fn is_end(self) -> bool {
        self.is_last() || self.is_only()
    }

    /// Carries a RETH: RDMA WRITE FIRST and ONLY (IBTA Vol 1 §9.3.3).
    pub const fn has_reth(self) -> bool {
        matches!(
            self,
            Opcode::RdmaWriteFirst | Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate
        )
    }

    /// Carries ImmDt: the `*_WITH_IMMEDIATE` opcodes (IBTA Vol 1 §9.3.4).
    pub const fn has_immdt(self) -> bool {
        matches!(
            self,
            Opcode::SendLastWithImmediate
                | Opcode::SendOnlyWithImmediate
                | Opcode::RdmaWriteLastWithImmediate
                | Opcode::RdmaWriteOnlyWithImmediate
        )
    }

    /// Bytes of BTH and extension headers before the payload.
    pub const fn header_len(self) -> usize {
        BTH_LEN
            + if self.has_reth() { RETH_LEN } else { 0 }
            + if self.has_immdt() { IMMDT_LEN } else { 0 }
    }

    /// The IBTA name, e.g. `UC_SEND_ONLY`.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::SendFirst => "UC_SEND_FIRST",
            Opcode::SendMiddle => "UC_SEND_MIDDLE",
            Opcode::SendLast => "UC_SEND_LAST",
            Opcode::SendLastWithImmediate => "UC_SEND_LAST_WITH_IMMEDIATE",
            Opcode::SendOnly => "UC_SEND_ONLY",
            Opcode::SendOnlyWithImmediate => "UC_SEND_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaWriteFirst => "UC_RDMA_WRITE_FIRST",
            Opcode::RdmaWriteMiddle => "UC_RDMA_WRITE_MIDDLE",
            Opcode::RdmaWriteLast => "UC_RDMA_WRITE_LAST",
            Opcode::RdmaWriteLastWithImmediate => "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Opcode::RdmaWriteOnly => "UC_RDMA_WRITE_ONLY",
            Opcode::RdmaWriteOnlyWithImmediate => "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<u8> for Opcode {
    type Error = PacketError;

    fn try_from(opcode: u8) -> Result<Self, PacketError> {
        Opcode::from_u8(opcode).ok_or(PacketError::NotUc { opcode })
    }
}

/// The RC opcodes of IBTA Vol 1 §9.2.1 (transport `000`) that uctel speaks, as rxe defines
/// them in `rxe_opcode.c` (`IB_OPCODE_RC_*`): SEND and RDMA WRITE requests, whose shapes are
/// those of the UC opcodes 0x20 lower ([`RcOpcode::from_uc`]), and ACKNOWLEDGE. RDMA READ,
/// atomics and their responses are not implemented;
/// [`RcPacketRepr::parse`](super::RcPacketRepr::parse) rejects them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum RcOpcode {
    /// `RC_SEND_FIRST` (0x00).
    SendFirst = 0x00,
    /// `RC_SEND_MIDDLE` (0x01).
    SendMiddle = 0x01,
    /// `RC_SEND_LAST` (0x02).
    SendLast = 0x02,
    /// `RC_SEND_LAST_WITH_IMMEDIATE` (0x03): carries ImmDt.
    SendLastWithImmediate = 0x03,
    /// `RC_SEND_ONLY` (0x04).
    SendOnly = 0x04,
    /// `RC_SEND_ONLY_WITH_IMMEDIATE` (0x05): carries ImmDt.
    SendOnlyWithImmediate = 0x05,
    /// `RC_RDMA_WRITE_FIRST` (0x06): carries RETH.
    RdmaWriteFirst = 0x06,
    /// `RC_RDMA_WRITE_MIDDLE` (0x07).
    RdmaWriteMiddle = 0x07,
    /// `RC_RDMA_WRITE_LAST` (0x08).
    RdmaWriteLast = 0x08,
    /// `RC_RDMA_WRITE_LAST_WITH_IMMEDIATE` (0x09): carries ImmDt.
    RdmaWriteLastWithImmediate = 0x09,
    /// `RC_RDMA_WRITE_ONLY` (0x0a): carries RETH.
    RdmaWriteOnly = 0x0a,
    /// `RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE` (0x0b): carries RETH then ImmDt.
    RdmaWriteOnlyWithImmediate = 0x0b,
    /// `RC_ACKNOWLEDGE` (0x11): BTH + AETH, no payload (IBTA Vol 1 §9.7.5.1).
    Acknowledge = 0x11,
}

impl RcOpcode {
    /// All supported RC opcodes in wire order.
    pub const ALL: [RcOpcode; 13] = [
        RcOpcode::SendFirst,
        RcOpcode::SendMiddle,
        RcOpcode::SendLast,
        RcOpcode::SendLastWithImmediate,
        RcOpcode::SendOnly,
        RcOpcode::SendOnlyWithImmediate,
        RcOpcode::RdmaWriteFirst,
        RcOpcode::RdmaWriteMiddle,
        RcOpcode::RdmaWriteLast,
        RcOpcode::RdmaWriteLastWithImmediate,
        RcOpcode::RdmaWriteOnly,
        RcOpcode::RdmaWriteOnlyWithImmediate,
        RcOpcode::Acknowledge,
    ];

    /// The opcode for a wire byte, or `None` if it is not a supported RC opcode.
    pub const fn from_u8(byte: u8) -> Option<RcOpcode> {
        Some(match byte {
            0x00 => RcOpcode::SendFirst,
            0x01 => RcOpcode::SendMiddle,
            0x02 => RcOpcode::SendLast,
            0x03 => RcOpcode::SendLastWithImmediate,
            0x04 => RcOpcode::SendOnly,
            0x05 => RcOpcode::SendOnlyWithImmediate,
            0x06 => RcOpcode::RdmaWriteFirst,
            0x07 => RcOpcode::RdmaWriteMiddle,
            0x08 => RcOpcode::RdmaWriteLast,
            0x09 => RcOpcode::RdmaWriteLastWithImmediate,
            0x0a => RcOpcode::RdmaWriteOnly,
            0x0b => RcOpcode::RdmaWriteOnlyWithImmediate,
            0x11 => RcOpcode::Acknowledge,
            _ => return None,
        })
    }

    /// The wire byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The RC request opcode with the shape of a UC opcode (same low five bits: IBTA Vol 1
    /// §9.2.1 numbers the operations alike in every transport).
    pub const fn from_uc(op: Opcode) -> RcOpcode {
        match RcOpcode::from_u8(op.as_u8() & 0x1f) {
            Some(rc) => rc,
            // Unreachable: every UC opcode minus 0x20 is an RC request opcode.
            None => RcOpcode::Acknowledge,
        }
    }

    /// The UC opcode of the same shape, for a request; `None` for ACKNOWLEDGE.
    pub const fn uc_shape(self) -> Option<Opcode> {
        if self.is_request() {
            Opcode::from_u8(self.as_u8() | 0x20)
        } else {
            None
        }
    }

    /// A request (SEND or RDMA WRITE), as opposed to a response.
    pub const fn is_request(self) -> bool {
        (self as u8) <= 0x0b
    }

    /// A SEND opcode (consumes a receive WR).
    pub const fn is_send(self) -> bool {
        (self as u8) <= 0x05
    }

    /// An RDMA WRITE opcode.
    pub const fn is_write(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.is_write())
    }

    /// First packet of a multi-packet message.
    pub const fn is_first(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.is_first())
    }

    /// Middle packet of a multi-packet message.
    pub const fn is_middle(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.is_middle())
    }

    /// Last packet of a multi-packet message.
    pub const fn is_last(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.is_last())
    }

    /// Only packet of a message.
    pub const fn is_only(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.is_only())
    }

    /// FIRST or ONLY (`RXE_START_MASK`).
    pub const fn is_start(self) -> bool {
        self.is_first() || self.is_only()
    }

    /// LAST or ONLY (`RXE_END_MASK`).
    pub const fn is_end(self) -> bool {
        self.is_last() || self.is_only()
    }

    /// Carries a RETH: RDMA WRITE FIRST and ONLY.
    pub const fn has_reth(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.has_reth())
    }

    /// Carries ImmDt: the `*_WITH_IMMEDIATE` opcodes.
    pub const fn has_immdt(self) -> bool {
        matches!(self.uc_shape(), Some(op) if op.has_immdt())
    }

    /// Carries an AETH: ACKNOWLEDGE (IBTA Vol 1 §9.3.5).
    pub const fn has_aeth(self) -> bool {
        matches!(self, RcOpcode::Acknowledge)
    }

    /// Bytes of BTH and extension headers before the payload.
    pub const fn header_len(self) -> usize {
        BTH_LEN
            + if self.has_reth() { RETH_LEN } else { 0 }
            + if self.has_aeth() { AETH_LEN } else { 0 }
            + if self.has_immdt() { IMMDT_LEN } else { 0 }
    }

    /// The IBTA name, e.g. `RC_SEND_ONLY`.
    pub const fn name(self) -> &'static str {
        match self {
            RcOpcode::SendFirst => "RC_SEND_FIRST",
            RcOpcode::SendMiddle => "RC_SEND_MIDDLE",
            RcOpcode::SendLast => "RC_SEND_LAST",
            RcOpcode::SendLastWithImmediate => "RC_SEND_LAST_WITH_IMMEDIATE",
            RcOpcode::SendOnly => "RC_SEND_ONLY",
            RcOpcode::SendOnlyWithImmediate => "RC_SEND_ONLY_WITH_IMMEDIATE",
            RcOpcode::RdmaWriteFirst => "RC_RDMA_WRITE_FIRST",
            RcOpcode::RdmaWriteMiddle => "RC_RDMA_WRITE_MIDDLE",
            RcOpcode::RdmaWriteLast => "RC_RDMA_WRITE_LAST",
            RcOpcode::RdmaWriteLastWithImmediate => "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            RcOpcode::RdmaWriteOnly => "RC_RDMA_WRITE_ONLY",
            RcOpcode::RdmaWriteOnlyWithImmediate => "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            RcOpcode::Acknowledge => "RC_ACKNOWLEDGE",
        }
    }
}

impl fmt::Display for RcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<u8> for RcOpcode {
    type Error = PacketError;

    fn try_from(opcode: u8) -> Result<Self, PacketError> {
        RcOpcode::from_u8(opcode).ok_or(PacketError::NotRc { opcode })
    }
}
