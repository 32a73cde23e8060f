//! [`RcPacketRepr`]: one parsed or to-be-emitted RC packet (BTH, RETH, AETH, ImmDt, payload).

use super::aeth::AethRepr;
use super::bth::RcBthRepr;
use super::opcode::Opcode;
use super::reth::{ImmDt, RethRepr};
use super::{at_offset, check_len, pad_for, PacketError};
use super::{AETH_LEN, BTH_LEN, ICRC_LEN, IMMDT_LEN, RETH_LEN};

/// One parsed RC packet, borrowing its payload.
///
/// `reth` is `Some` exactly when `bth.opcode.has_reth()`, `aeth` when `has_aeth()`, `imm` when
/// `has_immdt()`. Extension headers follow the BTH in IBTA order (Vol 1 §9.2: RETH, AETH,
/// ImmDt). `payload` excludes pad and ICRC; an ACKNOWLEDGE has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcPacketRepr<'a> {
    /// Base transport header.
    pub bth: RcBthRepr,
    /// RDMA extended transport header (WRITE FIRST / ONLY).
    pub reth: Option<RethRepr>,
    /// ACK extended transport header (ACKNOWLEDGE).
    pub aeth: Option<AethRepr>,
    /// Immediate data, big-endian value of the 4 wire bytes (`*_WITH_IMMEDIATE`).
    pub imm: Option<u32>,
    /// Payload without pad and ICRC.
    pub payload: &'a [u8],
}

impl<'a> RcPacketRepr<'a> {
    /// Parses one UDP payload (BTH .. ICRC). Never panics.
    ///
    /// Checks, in order: room for BTH + ICRC, a supported RC opcode, `TVer == 0`, the
    /// opcode's extension headers (a valid AETH syndrome), room for the ICRC, a total length
    /// that is a multiple of 4, a pad count that fits, and no payload on an ACKNOWLEDGE. The
    /// ICRC itself is not verified here ([`crate::soft::icrc::verify`]).
    ///
    /// # Errors
    /// The first failed check as a [`PacketError`].
    pub fn parse(udp_payload: &'a [u8]) -> Result<RcPacketRepr<'a>, PacketError> {
        if udp_payload.len() < BTH_LEN {
            return Err(PacketError::Truncated {
                header: "BTH",
                offset: 0,
                need: BTH_LEN,
                have: udp_payload.len(),
            });
        }
        check_len(udp_payload, "ICRC", BTH_LEN, ICRC_LEN)?;
        let bth = RcBthRepr::parse(udp_payload)?;
        let opcode = bth.opcode;
        let mut offset = BTH_LEN;
        let reth = if opcode.has_reth() {
            let rest = udp_payload.get(offset..).unwrap_or_default();
            let reth = RethRepr::parse(rest).map_err(|e| at_offset(e, offset))?;
            offset += RETH_LEN;
            Some(reth)
        } else {
            None
        };
        let aeth = if opcode.has_aeth() {
            let rest = udp_payload.get(offset..).unwrap_or_default();
            let aeth = AethRepr::parse(rest).map_err(|e| at_offset(e, offset))?;
            offset += AETH_LEN;
            Some(aeth)
        } else {
            None
        };
        let imm = if opcode.has_immdt() {
            let rest = udp_payload.get(offset..).unwrap_or_default();
            let imm = ImmDt::parse(rest).map_err(|e| at_offset(e, offset))?;
            offset += IMMDT_LEN;
            Some(imm.0)
        } else {
            None
        };
        check_len(udp_payload, "ICRC", offset, ICRC_LEN)?;
        let len = udp_payload.len();
        if len % 4 != 0 {
            return Err(PacketError::Misaligned { len });
        }
        let available = len - offset - ICRC_LEN;
        let pad = bth.pad_count;
        let payload_len = available
            .checked_sub(usize::from(pad))
            .ok_or(PacketError::BadPad { pad, available })?;
        if opcode.has_aeth() && available != 0 {
            // An ACKNOWLEDGE is BTH + AETH + ICRC (IBTA Vol 1 §9.2, rxe `rxe_opcode.c`
            // length 16 + ICRC): anything more is malformed.
            return Err(PacketError::BadPad { pad, available });
        }
        let payload = udp_payload
            .get(offset..offset + payload_len)
            .ok_or(PacketError::BadPad { pad, available })?;
        Ok(RcPacketRepr {
            bth,
            reth,
            aeth,
            imm,
            payload,
        })
    }

    /// Bytes [`RcPacketRepr::emit`] appends: headers + payload + pad + ICRC.
    pub fn buffer_len(&self) -> usize {
        self.bth.opcode.header_len()
            + self.payload.len()
            + usize::from(pad_for(self.payload.len()))
            + ICRC_LEN
    }

    /// Appends BTH, RETH, AETH, ImmDt, payload, zero pad and a zero ICRC placeholder to `out`;
    /// returns the number of bytes appended. Seal with [`crate::soft::icrc::seal`].
    ///
    /// # Errors
    /// [`PacketError::HeaderMismatch`] if the extension headers do not match the opcode or an
    /// ACKNOWLEDGE carries a payload, [`PacketError::FieldRange`] if a 24-bit field overflows;
    /// nothing is appended then.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<usize, PacketError> {
        let opcode = self.bth.opcode;
        let rc_mismatch = |requirement| PacketError::HeaderMismatch {
            opcode: opcode.uc_shape().unwrap_or(Opcode::SendOnly),
            requirement,
        };
        if opcode.has_reth() != self.reth.is_some() {
            return Err(rc_mismatch("RETH presence must follow the opcode"));
        }
        if opcode.has_immdt() != self.imm.is_some() {
            return Err(rc_mismatch("ImmDt presence must follow the opcode"));
        }
        if opcode.has_aeth() != self.aeth.is_some() {
            return Err(rc_mismatch("AETH presence must follow the opcode"));
        }
        if opcode.has_aeth() && !self.payload.is_empty() {
            return Err(rc_mismatch("ACKNOWLEDGE must not carry a payload"));
        }
        let pad = pad_for(self.payload.len());
        let bth = RcBthRepr {
            pad_count: pad,
            ..self.bth
        }
        .to_bytes()?;
        let aeth = match &self.aeth {
            Some(a) => Some(a.to_bytes()?),
            None => None,
        };
        let start = out.len();
        out.reserve(self.buffer_len());
        out.extend_from_slice(&bth);
        if let Some(reth) = &self.reth {
            reth.emit(out);
        }
        if let Some(aeth) = aeth {
            out.extend_from_slice(&aeth);
        }
        if let Some(imm) = self.imm {
            out.extend_from_slice(&ImmDt(imm).to_bytes());
        }
        out.extend_from_slice(self.payload);
        out.resize(out.len() + usize::from(pad) + ICRC_LEN, 0);
        Ok(out.len() - start)
    }
}
