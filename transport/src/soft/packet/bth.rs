//! The Base Transport Header (IBTA Vol 1 §9.2): the checked view [`Bth`] and the owned
//! [`BthRepr`], generic over the opcode set it speaks ([`Opcode`] for UC, [`RcOpcode`] for RC).

use std::fmt;

use crate::api::{PSN_MASK, QPN_MASK};
use crate::soft::psn::Psn;

use super::opcode::{Opcode, RcOpcode};
use super::{check_len, read_u16, read_u32, read_u8, write_slice, PacketError};
use super::{BTH_LEN, TRANSPORT_VERSION};

/// Checked view of a Base Transport Header (IBTA Vol 1 §9.2), 12 bytes:
///
/// ```text
///  byte 0      byte 1              bytes 2-3
/// +--------+-+-+--+----+----------------+
/// | OpCode |S|M|Pad|TVer|     P_Key      |
/// +--------+-+-+--+----+----------------+
/// |F|B|resv6|       DestQP (24)          |   byte 4: FECN, BECN, 6 reserved bits
/// +-+-+-----+----------------------------+
/// |A| resv7 |         PSN (24)           |   byte 8: AckReq, 7 reserved bits
/// +-+-------+----------------------------+
/// ```
///
/// `S` solicited event, `M` MigReq, `Pad` pad count (2 bits), `TVer` transport header version
/// (4 bits). Reserved bits are ignored on receive and sent as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps `buffer` after checking it holds at least [`BTH_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, PacketError> {
        check_len(buffer.as_ref(), "BTH", 0, BTH_LEN)?;
        Ok(Bth { buffer })
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The raw opcode byte (byte 0).
    pub fn opcode_raw(&self) -> u8 {
        read_u8(self.b(), 0)
    }

    /// Solicited event bit (byte 1, bit 7).
    pub fn solicited(&self) -> bool {
        read_u8(self.b(), 1) & 0x80 != 0
    }

    /// MigReq bit (byte 1, bit 6).
    pub fn mig_req(&self) -> bool {
        read_u8(self.b(), 1) & 0x40 != 0
    }

    /// Pad count 0..=3 (byte 1, bits 5-4).
    pub fn pad_count(&self) -> u8 {
        (read_u8(self.b(), 1) >> 4) & 0x3
    }

    /// Transport header version (byte 1, bits 3-0).
    pub fn transport_version(&self) -> u8 {
        read_u8(self.b(), 1) & 0x0f
    }

    /// Partition key (bytes 2-3).
    pub fn pkey(&self) -> u16 {
        read_u16(self.b(), 2)
    }

    /// FECN bit (byte 4, bit 7).
    pub fn fecn(&self) -> bool {
        read_u8(self.b(), 4) & 0x80 != 0
    }

    /// BECN bit (byte 4, bit 6).
    pub fn becn(&self) -> bool {
        read_u8(self.b(), 4) & 0x40 != 0
    }

    /// Destination QP number, 24 bits (bytes 5-7).
    pub fn dest_qpn(&self) -> u32 {
        read_u32(self.b(), 4) & QPN_MASK
    }

    /// AckReq bit (byte 8, bit 7).
    pub fn ack_req(&self) -> bool {
        read_u8(self.b(), 8) & 0x80 != 0
    }

    /// Packet sequence number, 24 bits (bytes 9-11).
    pub fn psn(&self) -> u32 {
        read_u32(self.b(), 8) & PSN_MASK
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Sets the PSN (bytes 9-11), keeping AckReq and the reserved bits; the value is
    /// masked to 24 bits.
    pub fn set_psn(&mut self, psn: u32) {
        let b = self.buffer.as_mut();
        let word = (read_u32(b, 8) & !PSN_MASK) | (psn & PSN_MASK);
        write_slice(b, 8, &word.to_be_bytes());
    }

    /// Sets the destination QPN (bytes 5-7); the value is masked to 24 bits.
    pub fn set_dest_qpn(&mut self, qpn: u32) {
        let b = self.buffer.as_mut();
        let word = (read_u32(b, 4) & !QPN_MASK) | (qpn & QPN_MASK);
        write_slice(b, 4, &word.to_be_bytes());
    }
}

/// An opcode set a [`BthRepr`] can carry in its byte 0: the UC opcodes ([`Opcode`]) or the
/// RC subset ([`RcOpcode`]). The BTH layout is the same for every transport (IBTA Vol 1 §9.2);
/// only which opcode bytes are accepted differs.
pub trait BthOpcode: Copy + fmt::Debug + PartialEq + Eq + std::hash::Hash {
    /// The wire byte.
    fn to_byte(self) -> u8;

    /// The opcode for a wire byte.
    ///
    /// # Errors
    /// [`PacketError::NotUc`] or [`PacketError::NotRc`] when the byte is not in the set.
    fn from_byte(byte: u8) -> Result<Self, PacketError>;
}

impl BthOpcode for Opcode {
    fn to_byte(self) -> u8 {
        self.as_u8()
    }

    fn from_byte(byte: u8) -> Result<Self, PacketError> {
        Opcode::try_from(byte)
    }
}

impl BthOpcode for RcOpcode {
    fn to_byte(self) -> u8 {
        self.as_u8()
    }

    fn from_byte(byte: u8) -> Result<Self, PacketError> {
        RcOpcode::try_from(byte)
    }
}

/// Owned BTH fields (IBTA Vol 1 §9.2) over the opcode set `O`: [`Opcode`] (UC, the default)
/// or [`RcOpcode`] ([`RcBthRepr`]). `dest_qpn` is a 24-bit value (checked by
/// [`BthRepr::to_bytes`]); `psn` is a [`Psn`], 24 bits by construction. The AckReq bit asks
/// an RC responder for an acknowledgement (IBTA Vol 1 §9.7.5.1); UC sends it as 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BthRepr<O = Opcode> {
    /// Opcode.
    pub opcode: O,
    /// Solicited event (S).
    pub solicited: bool,
    /// Migration request (M); rxe sends it set on RC/UC when APM state is migrated.
    pub mig_req: bool,
    /// Pad count 0..=3. [`PacketRepr::emit`](super::PacketRepr::emit) and
    /// [`RcPacketRepr::emit`](super::RcPacketRepr::emit) derive it from the payload length.
    pub pad_count: u8,
    /// Partition key; [`DEFAULT_PKEY`](super::DEFAULT_PKEY) for RoCE.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination QP number, 24 bits.
    pub dest_qpn: u32,
    /// Acknowledge request; meaningless on UC, sent as 0.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

/// Owned BTH fields of an RC packet: a [`BthRepr`] with an [`RcOpcode`].
pub type RcBthRepr = BthRepr<RcOpcode>;

impl<O: BthOpcode> BthRepr<O> {
    /// Parses the first [`BTH_LEN`] bytes of `buf`: checks the length, an opcode of the set
    /// `O` and `TVer == 0`.
    ///
    /// # Errors
    /// [`PacketError::Truncated`], [`PacketError::NotUc`] / [`PacketError::NotRc`],
    /// [`PacketError::BadTransportVersion`].
    pub fn parse(buf: &[u8]) -> Result<Self, PacketError> {
        let bth = Bth::new_checked(buf)?;
        let raw = bth.opcode_raw();
        let opcode = O::from_byte(raw)?;
        let tver = bth.transport_version();
        if tver != TRANSPORT_VERSION {
            return Err(PacketError::BadTransportVersion { tver, opcode: raw });
        }
        Ok(BthRepr {
            opcode,
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: Psn::new(bth.psn()),
        })
    }

    /// The 12 wire bytes, laid out as [`Bth`].
    ///
    /// # Errors
    /// [`PacketError::FieldRange`] if `dest_qpn` exceeds 24 bits or `pad_count` > 3.
    pub fn to_bytes(&self) -> Result<[u8; BTH_LEN], PacketError> {
        if self.dest_qpn > QPN_MASK {
            return Err(PacketError::FieldRange {
                field: "dest_qpn",
                value: u64::from(self.dest_qpn),
                bits: 24,
            });
        }
        if self.pad_count > 3 {
            return Err(PacketError::FieldRange {
                field: "pad_count",
                value: u64::from(self.pad_count),
                bits: 2,
            });
        }
        let flags = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | (self.pad_count << 4)
            | TRANSPORT_VERSION;
        let qp_word = (u32::from(self.fecn) << 31) | (u32::from(self.becn) << 30) | self.dest_qpn;
        let psn_word = (u32::from(self.ack_req) << 31) | (self.psn.value() & PSN_MASK);
        let mut out = [0u8; BTH_LEN];
        out[0] = self.opcode.to_byte();
        out[1] = flags;
        out[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        out[4..8].copy_from_slice(&qp_word.to_be_bytes());
        out[8..12].copy_from_slice(&psn_word.to_be_bytes());
        Ok(out)
    }

    /// Appends the 12 wire bytes to `out`.
    ///
    /// # Errors
    /// As [`BthRepr::to_bytes`]; nothing is appended then.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), PacketError> {
        out.extend_from_slice(&self.to_bytes()?);
        Ok(())
    }
}
