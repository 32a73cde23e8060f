//! [`RcPacketRepr`]: one parsed or to-be-emitted RC packet (BTH, RETH, AETH, ImmDt, payload).

use super::aeth::AethRepr;
use super::bth::RcBthRepr;
use super::opcode::Opcode;
use super::reth::{ImmDt, RethRepr};
use super::{check_len, ext_header, pad_for, payload_after, PacketError};
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
        let reth = ext_header(
            udp_payload,
            &mut offset,
            opcode.has_reth(),
            RETH_LEN,
            RethRepr::parse,
        )?;
        let aeth = ext_header(
            udp_payload,
            &mut offset,
            opcode.has_aeth(),
            AETH_LEN,
            AethRepr::parse,
        )?;
        let imm = ext_header(
            udp_payload,
            &mut offset,
            opcode.has_immdt(),
            IMMDT_LEN,
            ImmDt::parse,
        )?
        .map(|imm| imm.0);
        let pad = bth.pad_count;
        let (available, payload) = payload_after(udp_payload, offset, pad)?;
        if opcode.has_aeth() && available != 0 {
            // An ACKNOWLEDGE is BTH + AETH + ICRC (IBTA Vol 1 §9.2, rxe `rxe_opcode.c`
            // length 16 + ICRC): anything more is malformed.
            return Err(PacketError::BadPad { pad, available });
        }
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
