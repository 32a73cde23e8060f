//! The ACK Extended Transport Header of RC ACKNOWLEDGE packets (IBTA Vol 1 §9.3.5): syndrome
//! ([`AethSyndrome`], [`NakCode`]), MSN, and the RNR NAK timer table (§9.7.5.2.8, Table 45).

use crate::api::PSN_MASK;

use super::{check_len, read_u32, PacketError, AETH_LEN};

/// NAK codes of the AETH (IBTA Vol 1 §9.7.5.2.8; rxe `AETH_NAK_*` in `rxe_hdr.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum NakCode {
    /// 0: PSN sequence error; the requester resends from the NAK's PSN.
    PsnSequenceError = 0,
    /// 1: invalid request (bad opcode sequence, bad length).
    InvalidRequest = 1,
    /// 2: remote access error (rkey, access rights, bounds).
    RemoteAccessError = 2,
    /// 3: remote operational error.
    RemoteOperationalError = 3,
    /// 4: invalid RD request (Reliable Datagram only; never sent by this engine).
    InvalidRdRequest = 4,
}

impl NakCode {
    /// The code for a 5-bit value, or `None` for the reserved codes 5..=31.
    pub const fn from_u8(code: u8) -> Option<NakCode> {
        Some(match code {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

/// The AETH syndrome byte (IBTA Vol 1 §9.3.5, table "AETH syndrome"): bit 7 reserved (0),
/// bits 6-5 the type, bits 4-0 its value.
///
/// ```text
/// 0b000c_cccc  ACK, credit count c (0x1f: no end-to-end credits, what rxe sends)
/// 0b001t_tttt  RNR NAK, RNR timer code t (IBTA Table 45)
/// 0b011n_nnnn  NAK, code n (NakCode)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with a 5-bit credit count.
    Ack {
        /// Credit count 0..=31 (31 = invalid / unlimited, rxe `AETH_ACK_UNLIMITED`).
        credits: u8,
    },
    /// Receiver not ready, with the 5-bit RNR timer code the requester waits.
    RnrNak {
        /// RNR timer code 0..=31 ([`rnr_timer_micros`]).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

/// The credit count rxe puts in every ACK (`AETH_ACK_UNLIMITED`): "invalid", i.e. no
/// end-to-end flow control.
pub const ACK_CREDITS_UNLIMITED: u8 = 0x1f;

impl AethSyndrome {
    /// Decodes a syndrome byte.
    ///
    /// # Errors
    /// [`PacketError::BadAeth`] for bit 7 set, type `10`, or a NAK code above 4.
    pub const fn from_u8(syndrome: u8) -> Result<AethSyndrome, PacketError> {
        let value = syndrome & 0x1f;
        match syndrome >> 5 {
            0b000 => Ok(AethSyndrome::Ack { credits: value }),
            0b001 => Ok(AethSyndrome::RnrNak { timer: value }),
            0b011 => match NakCode::from_u8(value) {
                Some(code) => Ok(AethSyndrome::Nak(code)),
                None => Err(PacketError::BadAeth { syndrome }),
            },
            _ => Err(PacketError::BadAeth { syndrome }),
        }
    }

    /// The syndrome byte; values are masked to 5 bits.
    pub const fn as_u8(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(code) => 0x60 | code as u8,
        }
    }
}

/// The RNR NAK timer of IBTA Vol 1 §9.7.5.2.8 Table 45 in microseconds, indexed by the 5-bit
/// code: 0 is the longest (655.36 ms), 1..=31 run from 0.01 ms to 491.52 ms. The values are
/// rxe's `rnrnak_usec[]` (`rxe_comp.c`).
pub const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The RNR wait for a timer code in microseconds ([`RNR_TIMER_MICROS`]; the code is masked to
/// 5 bits).
pub const fn rnr_timer_micros(code: u8) -> u32 {
    RNR_TIMER_MICROS[(code & 0x1f) as usize]
}

/// Owned AETH fields (IBTA Vol 1 §9.3.5): the syndrome byte, then the 24-bit MSN (message
/// sequence number of the last message the responder completed, IBTA 9.7.5.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number, 24 bits.
    pub msn: u32,
}

impl AethRepr {
    /// Parses the first [`AETH_LEN`] bytes of `buf`.
    ///
    /// # Errors
    /// [`PacketError::Truncated`], [`PacketError::BadAeth`].
    pub fn parse(buf: &[u8]) -> Result<AethRepr, PacketError> {
        check_len(buf, "AETH", 0, AETH_LEN)?;
        let word = read_u32(buf, 0);
        Ok(AethRepr {
            syndrome: AethSyndrome::from_u8((word >> 24) as u8)?,
            msn: word & PSN_MASK,
        })
    }

    /// The 4 wire bytes.
    ///
    /// # Errors
    /// [`PacketError::FieldRange`] if `msn` exceeds 24 bits.
    pub fn to_bytes(&self) -> Result<[u8; AETH_LEN], PacketError> {
        if self.msn > PSN_MASK {
            return Err(PacketError::FieldRange {
                field: "msn",
                value: u64::from(self.msn),
                bits: 24,
            });
        }
        Ok(((u32::from(self.syndrome.as_u8()) << 24) | self.msn).to_be_bytes())
    }
}
