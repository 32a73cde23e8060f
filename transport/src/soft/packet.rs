//! RoCEv2 UC and RC packet headers: checked zero-copy views and owned reprs.
//!
//! One file because it is one concept: the BTH-based wire codec, whose UC and RC opcodes
//! share the BTH, RETH and ImmDt layouts and the same parse checks.
//!
//! A RoCEv2 packet travels as the payload of one UDP datagram to port 4791 (IBTA Vol 1
//! Annex A17 "RoCEv2", §A17.4). The UDP payload is laid out as
//!
//! ```text
//! +---------+------------------+-----------------+---------+-----+---------+
//! | BTH 12B | RETH 16B (opt.)  | ImmDt 4B (opt.) | payload | pad | ICRC 4B |
//! +---------+------------------+-----------------+---------+-----+---------+
//! ```
//!
//! Which extension headers follow the BTH is fixed by the opcode (IBTA Vol 1 §9.2, table
//! "OpCode field" and §9.3). [`PacketRepr`] speaks the Unreliable Connection transport, opcodes
//! `0x20..=0x2b` (transport bits `001`); every other opcode is rejected by [`PacketRepr::parse`].
//! [`RcPacketRepr`] speaks the Reliable Connection subset the RC engine uses
//! ([`crate::soft::rc`]): SEND and RDMA WRITE requests `0x00..=0x0b` and ACKNOWLEDGE `0x11`,
//! which carries the 4-byte AETH (syndrome + MSN, §9.3.5) after the BTH:
//!
//! ```text
//! +---------+---------+---------+
//! | BTH 12B | AETH 4B | ICRC 4B |      RC ACKNOWLEDGE
//! +---------+---------+---------+
//! ```
//!
//! The two codecs are separate types so that the UC engine can never be handed an RC packet.
//!
//! Views ([`Bth`], [`Reth`], [`ImmDt`] parsing) borrow the buffer and are checked once at
//! construction; after that no accessor can panic. Reprs ([`BthRepr`], [`RethRepr`],
//! [`PacketRepr`]) are plain values with `parse`/`emit`. All multi-byte fields are big-endian
//! (network order) as in IBTA Vol 1 §9.2; only the ICRC is sent least-significant byte first
//! (see [`crate::soft::icrc`]).

use std::fmt;

use thiserror::Error;

use crate::api::{PSN_MASK, QPN_MASK};

/// Length of the Base Transport Header in bytes (IBTA Vol 1 §9.2).
pub const BTH_LEN: usize = 12;
/// Length of the RDMA Extended Transport Header in bytes (IBTA Vol 1 §9.3.3).
pub const RETH_LEN: usize = 16;
/// Length of the Immediate Data extended header in bytes (IBTA Vol 1 §9.3.4).
pub const IMMDT_LEN: usize = 4;
/// Length of the Invariant CRC trailer in bytes (IBTA Vol 1 §7.8.1, Annex A17 §A17.4.5).
pub const ICRC_LEN: usize = 4;
/// The only transport header version defined by IBTA (BTH `TVer`, Vol 1 §9.2.1).
pub const TRANSPORT_VERSION: u8 = 0;
/// The default partition key (full membership), used by rxe for RoCE (IBTA Vol 1 §10.9.1).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Why a packet was rejected by a parser or an emitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum PacketError {
    /// The buffer ends before a header (or the ICRC trailer) is complete.
    #[error("truncated {header}: need {need} bytes from offset {offset}, have {have}")]
    Truncated {
        /// Which header was cut short ("BTH", "RETH", "ImmDt", "ICRC").
        header: &'static str,
        /// Offset of that header in the UDP payload.
        offset: usize,
        /// Bytes the header needs.
        need: usize,
        /// Bytes available from `offset`.
        have: usize,
    },
    /// The BTH opcode is not one of the UC opcodes `0x20..=0x2b`.
    #[error("opcode {opcode:#04x} is not a UC opcode (0x20..=0x2b)")]
    NotUc {
        /// The opcode byte found.
        opcode: u8,
    },
    /// The BTH transport header version (`TVer`) is not 0 (IBTA Vol 1 §9.2.1; rxe drops it).
    #[error("transport header version {tver} (only 0 is defined), opcode {opcode:#04x}")]
    BadTransportVersion {
        /// The `TVer` nibble found.
        tver: u8,
        /// The packet's opcode.
        opcode: u8,
    },
    /// The UDP payload length is not a multiple of 4: IBA packets are padded to 4-byte
    /// multiples (IBTA Vol 1 §9.2.3, pad count).
    #[error("packet length {len} is not a multiple of 4 bytes")]
    Misaligned {
        /// The UDP payload length.
        len: usize,
    },
    /// The pad count is larger than the bytes left between the headers and the ICRC.
    #[error("pad count {pad} exceeds the {available} bytes between headers and ICRC")]
    BadPad {
        /// The pad count from the BTH.
        pad: u8,
        /// Bytes between the end of the headers and the ICRC.
        available: usize,
    },
    /// A repr field does not fit its wire field (emit only).
    #[error("{field} = {value:#x} does not fit its {bits}-bit field")]
    FieldRange {
        /// Field name ("dest_qpn", "psn").
        field: &'static str,
        /// The offending value.
        value: u64,
        /// Width of the wire field.
        bits: u8,
    },
    /// The BTH opcode is not one of the RC opcodes this codec speaks: `0x00..=0x0b` (SEND,
    /// RDMA WRITE) and `0x11` (ACKNOWLEDGE). READ, atomics and their responses are not
    /// implemented.
    #[error("opcode {opcode:#04x} is not a supported RC opcode (0x00..=0x0b, 0x11)")]
    NotRc {
        /// The opcode byte found.
        opcode: u8,
    },
    /// The AETH syndrome is reserved (IBTA Vol 1 §9.3.5, table "AETH syndrome"): bit 7 set,
    /// type `10`, or a NAK code above 4.
    #[error("AETH syndrome {syndrome:#04x} is reserved")]
    BadAeth {
        /// The syndrome byte found.
        syndrome: u8,
    },
    /// The extension headers of a repr do not match its opcode (emit only): e.g. an
    /// RDMA WRITE FIRST without a RETH, or a SEND ONLY with an immediate.
    #[error("opcode {opcode:?} {requirement}")]
    HeaderMismatch {
        /// The repr's opcode.
        opcode: Opcode,
        /// What is wrong, e.g. "needs a RETH", "must not carry ImmDt".
        requirement: &'static str,
    },
}

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

/// Copies `N` bytes at `at`; returns zeros if out of range (never reached after a checked
/// constructor, but keeps every accessor panic-free).
fn read_array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = at.checked_add(N).and_then(|end| buf.get(at..end)) {
        out.copy_from_slice(src);
    }
    out
}

/// Writes `bytes` at `at`; does nothing if out of range (never reached after a checked
/// constructor).
fn write_slice(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = at
        .checked_add(bytes.len())
        .and_then(|end| buf.get_mut(at..end))
    {
        dst.copy_from_slice(bytes);
    }
}

fn read_u8(buf: &[u8], at: usize) -> u8 {
    read_array::<1>(buf, at)[0]
}

fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(read_array(buf, at))
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(read_array(buf, at))
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(read_array(buf, at))
}

fn check_len(
    buf: &[u8],
    header: &'static str,
    offset: usize,
    need: usize,
) -> Result<(), PacketError> {
    let have = buf.len().saturating_sub(offset);
    if have < need {
        return Err(PacketError::Truncated {
            header,
            offset,
            need,
            have,
        });
    }
    Ok(())
}

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

/// Owned BTH fields (IBTA Vol 1 §9.2). `opcode` is always a UC opcode; `dest_qpn` and `psn`
/// are 24-bit values (checked by [`BthRepr::emit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// UC opcode.
    pub opcode: Opcode,
    /// Solicited event (S).
    pub solicited: bool,
    /// Migration request (M); rxe sends it set on RC/UC when APM state is migrated.
    pub mig_req: bool,
    /// Pad count 0..=3. [`PacketRepr::emit`] derives it from the payload length.
    pub pad_count: u8,
    /// Partition key; [`DEFAULT_PKEY`] for RoCE.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination QP number, 24 bits.
    pub dest_qpn: u32,
    /// Acknowledge request; meaningless on UC, sent as 0.
    pub ack_req: bool,
    /// Packet sequence number, 24 bits.
    pub psn: u32,
}

impl BthRepr {
    /// Parses the first [`BTH_LEN`] bytes of `buf`: checks the length, a UC opcode and
    /// `TVer == 0`.
    pub fn parse(buf: &[u8]) -> Result<BthRepr, PacketError> {
        let bth = Bth::new_checked(buf)?;
        let raw = bth.opcode_raw();
        let opcode = Opcode::try_from(raw)?;
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
            psn: bth.psn(),
        })
    }

    /// The 12 wire bytes. Errors if `dest_qpn` or `psn` exceed 24 bits or `pad_count` > 3.
    pub fn to_bytes(&self) -> Result<[u8; BTH_LEN], PacketError> {
        if self.dest_qpn > QPN_MASK {
            return Err(PacketError::FieldRange {
                field: "dest_qpn",
                value: u64::from(self.dest_qpn),
                bits: 24,
            });
        }
        if self.psn > PSN_MASK {
            return Err(PacketError::FieldRange {
                field: "psn",
                value: u64::from(self.psn),
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
        let psn_word = (u32::from(self.ack_req) << 31) | self.psn;
        let mut out = [0u8; BTH_LEN];
        out[0] = self.opcode.as_u8();
        out[1] = flags;
        out[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        out[4..8].copy_from_slice(&qp_word.to_be_bytes());
        out[8..12].copy_from_slice(&psn_word.to_be_bytes());
        Ok(out)
    }

    /// Appends the 12 wire bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), PacketError> {
        out.extend_from_slice(&self.to_bytes()?);
        Ok(())
    }
}

/// Checked view of an RDMA Extended Transport Header (IBTA Vol 1 §9.3.3), 16 bytes:
/// VirtualAddress (8, bytes 0-7), R_Key (4, bytes 8-11), DMALength (4, bytes 12-15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Wraps `buffer` after checking it holds at least [`RETH_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, PacketError> {
        check_len(buffer.as_ref(), "RETH", 0, RETH_LEN)?;
        Ok(Reth { buffer })
    }

    /// Returns the wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Remote virtual address the message starts at.
    pub fn virtual_addr(&self) -> u64 {
        read_u64(self.buffer.as_ref(), 0)
    }

    /// Remote key of the target memory region.
    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 8)
    }

    /// Length of the whole message in bytes (not of this packet).
    pub fn dma_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 12)
    }
}

/// Owned RETH fields (IBTA Vol 1 §9.3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address the message starts at.
    pub virtual_addr: u64,
    /// Remote key of the target memory region.
    pub rkey: u32,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses the first [`RETH_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<RethRepr, PacketError> {
        let reth = Reth::new_checked(buf)?;
        Ok(RethRepr {
            virtual_addr: reth.virtual_addr(),
            rkey: reth.rkey(),
            dma_len: reth.dma_len(),
        })
    }

    /// The 16 wire bytes.
    pub fn to_bytes(&self) -> [u8; RETH_LEN] {
        let mut out = [0u8; RETH_LEN];
        out[0..8].copy_from_slice(&self.virtual_addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
        out
    }

    /// Appends the 16 wire bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }
}

/// The Immediate Data extended header (IBTA Vol 1 §9.3.4): 4 bytes, delivered to the
/// responder's receive completion (`ibv_wc.imm_data`) in network byte order. The value here is
/// the big-endian interpretation of the 4 wire bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ImmDt(pub u32);

impl ImmDt {
    /// Parses the first [`IMMDT_LEN`] bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<ImmDt, PacketError> {
        check_len(buf, "ImmDt", 0, IMMDT_LEN)?;
        Ok(ImmDt(read_u32(buf, 0)))
    }

    /// The 4 wire bytes.
    pub fn to_bytes(self) -> [u8; IMMDT_LEN] {
        self.0.to_be_bytes()
    }
}

/// Pad bytes needed after `payload_len` bytes of payload to reach a 4-byte multiple.
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len % 4)) % 4) as u8
}

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
        let bth = BthRepr::parse(udp_payload)?;
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
        let payload = udp_payload
            .get(offset..offset + payload_len)
            .ok_or(PacketError::BadPad { pad, available })?;
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

fn mismatch(opcode: Opcode, requirement: &'static str) -> PacketError {
    PacketError::HeaderMismatch {
        opcode,
        requirement,
    }
}

/// Shifts the offset of a `Truncated` error from a sub-slice to the packet.
fn at_offset(e: PacketError, base: usize) -> PacketError {
    match e {
        PacketError::Truncated {
            header,
            offset,
            need,
            have,
        } => PacketError::Truncated {
            header,
            offset: offset + base,
            need,
            have,
        },
        other => other,
    }
}

// -- Reliable Connection --------------------------------------------------------------------

/// Length of the ACK Extended Transport Header in bytes (IBTA Vol 1 §9.3.5).
pub const AETH_LEN: usize = 4;

/// The RC opcodes of IBTA Vol 1 §9.2.1 (transport `000`) that uctel speaks, as rxe defines
/// them in `rxe_opcode.c` (`IB_OPCODE_RC_*`): SEND and RDMA WRITE requests, whose shapes are
/// those of the UC opcodes 0x20 lower ([`RcOpcode::from_uc`]), and ACKNOWLEDGE. RDMA READ,
/// atomics and their responses are not implemented; [`RcPacketRepr::parse`] rejects them.
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

/// Owned BTH fields of an RC packet: [`BthRepr`] with an [`RcOpcode`]. The AckReq bit asks
/// the responder for an acknowledgement (IBTA Vol 1 §9.7.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RcBthRepr {
    /// RC opcode.
    pub opcode: RcOpcode,
    /// Solicited event (S).
    pub solicited: bool,
    /// Migration request (M).
    pub mig_req: bool,
    /// Pad count 0..=3. [`RcPacketRepr::emit`] derives it from the payload length.
    pub pad_count: u8,
    /// Partition key; [`DEFAULT_PKEY`] for RoCE.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination QP number, 24 bits.
    pub dest_qpn: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number, 24 bits.
    pub psn: u32,
}

impl RcBthRepr {
    /// Parses the first [`BTH_LEN`] bytes of `buf`: checks the length, a supported RC opcode
    /// and `TVer == 0`.
    ///
    /// # Errors
    /// [`PacketError::Truncated`], [`PacketError::NotRc`], [`PacketError::BadTransportVersion`].
    pub fn parse(buf: &[u8]) -> Result<RcBthRepr, PacketError> {
        let bth = Bth::new_checked(buf)?;
        let raw = bth.opcode_raw();
        let opcode = RcOpcode::try_from(raw)?;
        let tver = bth.transport_version();
        if tver != TRANSPORT_VERSION {
            return Err(PacketError::BadTransportVersion { tver, opcode: raw });
        }
        Ok(RcBthRepr {
            opcode,
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// The 12 wire bytes, laid out as [`Bth`].
    ///
    /// # Errors
    /// [`PacketError::FieldRange`] if `dest_qpn` or `psn` exceed 24 bits or `pad_count` > 3.
    pub fn to_bytes(&self) -> Result<[u8; BTH_LEN], PacketError> {
        // Same layout as a UC BTH; only byte 0 differs.
        let mut out = BthRepr {
            opcode: Opcode::SendOnly,
            solicited: self.solicited,
            mig_req: self.mig_req,
            pad_count: self.pad_count,
            pkey: self.pkey,
            fecn: self.fecn,
            becn: self.becn,
            dest_qpn: self.dest_qpn,
            ack_req: self.ack_req,
            psn: self.psn,
        }
        .to_bytes()?;
        out[0] = self.opcode.as_u8();
        Ok(out)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: 0x000abc,
            ack_req: false,
            psn: 0xfffffe,
        }
    }

    fn repr(opcode: Opcode, payload: &[u8]) -> PacketRepr<'_> {
        PacketRepr {
            bth: bth(opcode),
            reth: opcode.has_reth().then_some(RethRepr {
                virtual_addr: 0x1000,
                rkey: 0x1234,
                dma_len: payload.len() as u32,
            }),
            imm: opcode.has_immdt().then_some(0x0102_0304),
            payload,
        }
    }

    #[test]
    fn opcode_table_matches_ibta() {
        for byte in 0u8..=255 {
            match Opcode::from_u8(byte) {
                Some(op) => {
                    assert!((0x20..=0x2b).contains(&byte));
                    assert_eq!(op.as_u8(), byte);
                    // Exactly one of first/middle/last/only.
                    let kinds = [op.is_first(), op.is_middle(), op.is_last(), op.is_only()];
                    assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{op}");
                    assert_ne!(op.is_send(), op.is_write());
                }
                None => assert!(!(0x20..=0x2b).contains(&byte)),
            }
        }
        assert_eq!(Opcode::ALL.len(), 12);
        assert_eq!(Opcode::SendOnly.header_len(), 12);
        assert_eq!(Opcode::SendOnlyWithImmediate.header_len(), 16);
        assert_eq!(Opcode::RdmaWriteFirst.header_len(), 28);
        assert_eq!(Opcode::RdmaWriteOnlyWithImmediate.header_len(), 32);
        assert_eq!(Opcode::RdmaWriteMiddle.header_len(), 12);
        assert!(!Opcode::RdmaWriteLast.has_reth());
        assert!(Opcode::RdmaWriteLastWithImmediate.has_immdt());
    }

    #[test]
    fn round_trip_every_opcode_and_pad() {
        let data: Vec<u8> = (0..40u8).collect();
        for op in Opcode::ALL {
            for len in [0usize, 1, 2, 3, 4, 5, 31, 32, 33] {
                let p = repr(op, &data[..len]);
                let mut buf = vec![0xaa];
                let n = p.emit(&mut buf).expect("emit");
                assert_eq!(n, p.buffer_len());
                assert_eq!(n % 4, 0);
                let parsed = PacketRepr::parse(&buf[1..]).expect("parse");
                assert_eq!(parsed.payload, &data[..len]);
                assert_eq!(parsed.reth, p.reth);
                assert_eq!(parsed.imm, p.imm);
                assert_eq!(parsed.bth.pad_count, pad_for(len));
                assert_eq!(
                    BthRepr {
                        pad_count: 0,
                        ..parsed.bth
                    },
                    p.bth
                );
            }
        }
    }

    #[test]
    fn rejects_non_uc_and_bad_version() {
        let mut buf = Vec::new();
        repr(Opcode::SendOnly, &[1, 2, 3, 4])
            .emit(&mut buf)
            .expect("emit");
        for op in [0x04u8, 0x0a, 0x1f, 0x2c, 0x64, 0xff] {
            let mut b = buf.clone();
            b[0] = op;
            assert_eq!(
                PacketRepr::parse(&b),
                Err(PacketError::NotUc { opcode: op })
            );
        }
        let mut b = buf.clone();
        b[1] |= 0x01;
        assert_eq!(
            PacketRepr::parse(&b),
            Err(PacketError::BadTransportVersion {
                tver: 1,
                opcode: 0x24
            })
        );
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut buf = Vec::new();
        repr(Opcode::RdmaWriteOnlyWithImmediate, &[])
            .emit(&mut buf)
            .expect("emit");
        assert_eq!(buf.len(), 36);
        for len in 0..buf.len() {
            assert!(PacketRepr::parse(&buf[..len]).is_err(), "len {len}");
        }
        assert_eq!(
            PacketRepr::parse(&[]),
            Err(PacketError::Truncated {
                header: "BTH",
                offset: 0,
                need: 12,
                have: 0
            })
        );
        assert_eq!(
            PacketRepr::parse(&buf[..20]),
            Err(PacketError::Truncated {
                header: "RETH",
                offset: 12,
                need: 16,
                have: 8
            })
        );
        assert_eq!(
            PacketRepr::parse(&buf[..14]),
            Err(PacketError::Truncated {
                header: "ICRC",
                offset: 12,
                need: 4,
                have: 2
            })
        );
        // Pad count larger than the payload.
        let mut b = Vec::new();
        repr(Opcode::SendOnly, &[]).emit(&mut b).expect("emit");
        b[1] |= 0x30;
        assert_eq!(
            PacketRepr::parse(&b),
            Err(PacketError::BadPad {
                pad: 3,
                available: 0
            })
        );
        let mut b = Vec::new();
        repr(Opcode::SendOnly, &[1, 2, 3, 4])
            .emit(&mut b)
            .expect("emit");
        b.push(0);
        assert_eq!(
            PacketRepr::parse(&b),
            Err(PacketError::Misaligned { len: 21 })
        );
    }

    #[test]
    fn emit_checks_headers_and_ranges() {
        let mut out = Vec::new();
        let mut p = repr(Opcode::RdmaWriteFirst, &[]);
        p.reth = None;
        assert!(matches!(
            p.emit(&mut out),
            Err(PacketError::HeaderMismatch { .. })
        ));
        let mut p = repr(Opcode::SendOnly, &[]);
        p.imm = Some(1);
        assert!(matches!(
            p.emit(&mut out),
            Err(PacketError::HeaderMismatch { .. })
        ));
        let mut p = repr(Opcode::SendOnly, &[]);
        p.bth.psn = 1 << 24;
        assert!(matches!(
            p.emit(&mut out),
            Err(PacketError::FieldRange { field: "psn", .. })
        ));
        let mut p = repr(Opcode::SendOnly, &[]);
        p.bth.dest_qpn = u32::MAX;
        assert!(matches!(
            p.emit(&mut out),
            Err(PacketError::FieldRange {
                field: "dest_qpn",
                ..
            })
        ));
        assert!(out.is_empty());
    }

    #[test]
    fn bth_view_setters_keep_other_bits() {
        let mut raw = bth(Opcode::SendOnly).to_bytes().expect("bytes");
        raw[4] |= 0xc0;
        raw[8] |= 0x80;
        let mut view = Bth::new_checked(&mut raw[..]).expect("view");
        view.set_psn(0x123456);
        view.set_dest_qpn(0xabcdef);
        assert_eq!(view.psn(), 0x123456);
        assert_eq!(view.dest_qpn(), 0xabcdef);
        assert!(view.fecn() && view.becn() && view.ack_req());
        assert!(Bth::new_checked(&raw[..11]).is_err());
    }

    fn rc_repr(opcode: RcOpcode, payload: &[u8]) -> RcPacketRepr<'_> {
        RcPacketRepr {
            bth: RcBthRepr {
                opcode,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qpn: 0x000abc,
                ack_req: opcode.is_end(),
                psn: 0xfffffe,
            },
            reth: opcode.has_reth().then_some(RethRepr {
                virtual_addr: 0x1000,
                rkey: 0x1234,
                dma_len: payload.len() as u32,
            }),
            aeth: opcode.has_aeth().then_some(AethRepr {
                syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
                msn: 0x00_1234,
            }),
            imm: opcode.has_immdt().then_some(0x0102_0304),
            payload: if opcode.has_aeth() { &[] } else { payload },
        }
    }

    #[test]
    fn rc_opcode_table_matches_ibta() {
        for byte in 0u8..=255 {
            match RcOpcode::from_u8(byte) {
                Some(op) => {
                    assert!(byte <= 0x0b || byte == 0x11, "{byte:#x}");
                    assert_eq!(op.as_u8(), byte);
                    if op.is_request() {
                        let uc = op.uc_shape().expect("request has a UC shape");
                        assert_eq!(uc.as_u8(), byte + 0x20);
                        assert_eq!(RcOpcode::from_uc(uc), op);
                        let kinds = [op.is_first(), op.is_middle(), op.is_last(), op.is_only()];
                        assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{op}");
                        assert_eq!(op.header_len(), uc.header_len());
                        assert_ne!(op.is_send(), op.is_write());
                    } else {
                        assert_eq!(op, RcOpcode::Acknowledge);
                        assert_eq!(op.header_len(), 16);
                    }
                }
                None => assert!(!(byte <= 0x0b || byte == 0x11), "{byte:#x}"),
            }
        }
        // The UC codec still refuses every RC opcode, and the RC codec every UC one.
        let mut b = Vec::new();
        rc_repr(RcOpcode::SendOnly, &[1, 2, 3, 4])
            .emit(&mut b)
            .expect("emit");
        assert_eq!(
            PacketRepr::parse(&b),
            Err(PacketError::NotUc { opcode: 0x04 })
        );
        b[0] = 0x24;
        assert_eq!(
            RcPacketRepr::parse(&b),
            Err(PacketError::NotRc { opcode: 0x24 })
        );
    }

    #[test]
    fn aeth_syndromes_round_trip_and_reserved_ones_fail() {
        for byte in 0u8..=255 {
            match AethSyndrome::from_u8(byte) {
                Ok(s) => assert_eq!(s.as_u8(), byte),
                Err(e) => {
                    assert_eq!(e, PacketError::BadAeth { syndrome: byte });
                    assert!(
                        byte & 0x80 != 0
                            || byte >> 5 == 0b010
                            || (byte >> 5 == 0b011 && byte & 0x1f > 4)
                    );
                }
            }
        }
        assert_eq!(
            AethSyndrome::Ack {
                credits: ACK_CREDITS_UNLIMITED
            }
            .as_u8(),
            0x1f
        );
        assert_eq!(AethSyndrome::RnrNak { timer: 12 }.as_u8(), 0x2c);
        assert_eq!(AethSyndrome::Nak(NakCode::PsnSequenceError).as_u8(), 0x60);
        assert_eq!(AethSyndrome::Nak(NakCode::RemoteAccessError).as_u8(), 0x62);
        let a = AethRepr {
            syndrome: AethSyndrome::Ack { credits: 0x1f },
            msn: 0xab_cdef,
        };
        let bytes = a.to_bytes().expect("bytes");
        assert_eq!(bytes, [0x1f, 0xab, 0xcd, 0xef]);
        assert_eq!(AethRepr::parse(&bytes), Ok(a));
        assert!(AethRepr { msn: 1 << 24, ..a }.to_bytes().is_err());
        assert_eq!(rnr_timer_micros(0), 655_360);
        assert_eq!(rnr_timer_micros(1), 10);
        assert_eq!(rnr_timer_micros(14), 1_280);
        assert_eq!(rnr_timer_micros(31), 491_520);
        assert!(RNR_TIMER_MICROS[1..].windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn rc_round_trip_every_opcode_and_pad() {
        let data: Vec<u8> = (0..40u8).collect();
        for op in RcOpcode::ALL {
            for len in [0usize, 1, 2, 3, 4, 5, 31, 32, 33] {
                let p = rc_repr(op, &data[..len]);
                let mut buf = vec![0xaa];
                let n = p.emit(&mut buf).expect("emit");
                assert_eq!(n, p.buffer_len());
                assert_eq!(n % 4, 0);
                let parsed = RcPacketRepr::parse(&buf[1..]).expect("parse");
                assert_eq!(parsed.payload, p.payload);
                assert_eq!(
                    (parsed.reth, parsed.aeth, parsed.imm),
                    (p.reth, p.aeth, p.imm)
                );
                assert_eq!(
                    RcBthRepr {
                        pad_count: 0,
                        ..parsed.bth
                    },
                    p.bth
                );
                // Every cut short of the headers, or off a 4-byte multiple, fails; the others
                // parse as a shorter packet or fail, without panicking.
                for cut in 0..n {
                    let r = RcPacketRepr::parse(&buf[1..1 + cut]);
                    if cut < op.header_len() + ICRC_LEN || cut % 4 != 0 {
                        assert!(r.is_err(), "{op} {len} {cut}");
                    }
                }
            }
        }
    }

    #[test]
    fn rc_ack_layout_and_malformed_acks() {
        let p = rc_repr(RcOpcode::Acknowledge, &[]);
        let mut buf = Vec::new();
        p.emit(&mut buf).expect("emit");
        assert_eq!(buf.len(), 20);
        assert_eq!(&buf[12..16], &[0x60, 0x00, 0x12, 0x34]);
        // Reserved syndrome.
        let mut b = buf.clone();
        b[12] = 0x40;
        assert_eq!(
            RcPacketRepr::parse(&b),
            Err(PacketError::BadAeth { syndrome: 0x40 })
        );
        // A payload on an ACK.
        let mut b = buf.clone();
        b.splice(16..16, [0u8; 4]);
        assert!(RcPacketRepr::parse(&b).is_err());
        let with_payload = RcPacketRepr { payload: &[1], ..p };
        assert!(matches!(
            with_payload.emit(&mut Vec::new()),
            Err(PacketError::HeaderMismatch { .. })
        ));
        // ACK without AETH on emit.
        let no_aeth = RcPacketRepr { aeth: None, ..p };
        assert!(no_aeth.emit(&mut Vec::new()).is_err());
    }
}
