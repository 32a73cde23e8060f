//! [`PacketRepr`]: one parsed or to-be-emitted UC packet (BTH, RETH, ImmDt, payload).

use super::bth::BthRepr;
use super::opcode::Opcode;
use super::reth::{ImmDt, RethRepr};
use super::{check_len, ext_header, mismatch, pad_for, payload_after, PacketError};
use super::{BTH_LEN, ICRC_LEN, IMMDT_LEN, RETH_LEN};

/// One parsed UC packet, borrowing its payload from the UDP payload it was parsed from.
///
/// `reth` is `Some` exactly when `bth.opcode.has_reth()`, `imm` exactly when
/// `bth.opcode.has_immdt()`. `payload` excludes the pad bytes and the ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// Base transport header.
    pub bth: BthRepr,
    /// RDMA extended transport header (WRITE FIRST / ONLY).
    pub reth: Option<RethRepr>,
    /// Immediate data, big-endian value of the 4 wire bytes (`*_WITH_IMMEDIATE`).
    pub imm: Option<u32>,
    /// Message payload of this packet, without pad and ICRC.
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// Parses one UDP payload (BTH .. ICRC). Never panics.
    ///
    /// Checks, in order: room for BTH + ICRC, a UC opcode, `TVer == 0`, room for the
    /// opcode's extension headers + ICRC, a total length that is a multiple of 4, and a pad
    /// count that fits before the ICRC. The ICRC itself is *not* verified here: use
    /// [`crate::soft::icrc::verify`], which needs the IP addresses and ports.
    pub fn parse(udp_payload: &'a [u8]) -> Result<PacketRepr<'a>, PacketError> {
        check_len(udp_payload, "BTH", 0, BTH_LEN + ICRC_LEN).map_err(|e| match e {
            PacketError::Truncated { have, .. } if have >= BTH_LEN => PacketError::Truncated {
                header: "ICRC",
                offset: BTH_LEN,
                need: ICRC_LEN,
                have: have - BTH_LEN,
            },
            PacketError::Truncated { have, offset, .. } => PacketError::Truncated {
                header: "BTH",
                offset,
                need: BTH_LEN,
                have,
            },
            other => other,
        })?;
        let bth = BthRepr::<Opcode>::parse(udp_payload)?;
        let opcode = bth.opcode;
        let mut offset = BTH_LEN;
        let reth = ext_header(
            udp_payload,
            &mut offset,
            opcode.has_reth(),
            RETH_LEN,
            RethRepr::parse,
        )?;
        let imm = ext_header(
            udp_payload,
            &mut offset,
            opcode.has_immdt(),
            IMMDT_LEN,
            ImmDt::parse,
        )?
        .map(|imm| imm.0);
        let (_, payload) = payload_after(udp_payload, offset, bth.pad_count)?;
        Ok(PacketRepr {
            bth,
            reth,
            imm,
            payload,
        })
    }

    /// Bytes [`PacketRepr::emit`] appends: headers + payload + pad + ICRC.
    pub fn buffer_len(&self) -> usize {
        self.bth.opcode.header_len()
            + self.payload.len()
            + usize::from(pad_for(self.payload.len()))
            + ICRC_LEN
    }

    /// Appends BTH, RETH, ImmDt, payload, zero pad bytes and a zero ICRC placeholder to
    /// `out`; returns the number of bytes appended. Seal the result with
    /// [`crate::soft::icrc::seal`].
    ///
    /// The BTH pad count is derived from `payload.len()` (the `bth.pad_count` field is
    /// ignored). Errors (nothing appended) if the extension headers do not match the
    /// opcode or a 24-bit field overflows.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<usize, PacketError> {
        let opcode = self.bth.opcode;
        match (opcode.has_reth(), self.reth.is_some()) {
            (true, false) => return Err(mismatch(opcode, "needs a RETH")),
            (false, true) => return Err(mismatch(opcode, "must not carry a RETH")),
            _ => {}
        }
        match (opcode.has_immdt(), self.imm.is_some()) {
            (true, false) => return Err(mismatch(opcode, "needs ImmDt")),
            (false, true) => return Err(mismatch(opcode, "must not carry ImmDt")),
            _ => {}
        }
        let pad = pad_for(self.payload.len());
        let bth = BthRepr {
            pad_count: pad,
            ..self.bth
        }
        .to_bytes()?;
        let start = out.len();
        out.reserve(self.buffer_len());
        out.extend_from_slice(&bth);
        if let Some(reth) = &self.reth {
            reth.emit(out);
        }
        if let Some(imm) = self.imm {
            out.extend_from_slice(&ImmDt(imm).to_bytes());
        }
        out.extend_from_slice(self.payload);
        out.resize(out.len() + usize::from(pad) + ICRC_LEN, 0);
        Ok(out.len() - start)
    }
}
