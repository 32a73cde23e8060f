//! RoCEv2 UC and RC packet headers: checked zero-copy views and owned reprs.
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
//!
//! One submodule per header: `bth` (the BTH view and [`BthRepr`], generic over the opcode
//! set), `opcode` ([`Opcode`], [`RcOpcode`]), `reth` (RETH and ImmDt), `aeth` (AETH, NAK
//! codes, RNR timer), and one per transport's packet repr (`uc`, `rc`). Every item is
//! re-exported here.

mod aeth;
mod bth;
mod opcode;
mod rc;
mod reth;
mod uc;

pub use aeth::{
    rnr_timer_micros, AethRepr, AethSyndrome, NakCode, ACK_CREDITS_UNLIMITED, RNR_TIMER_MICROS,
};
pub use bth::{Bth, BthOpcode, BthRepr, RcBthRepr};
pub use opcode::{Opcode, RcOpcode};
pub use rc::RcPacketRepr;
pub use reth::{ImmDt, Reth, RethRepr};
pub use uc::PacketRepr;

use thiserror::Error;

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
/// Length of the ACK Extended Transport Header in bytes (IBTA Vol 1 §9.3.5).
pub const AETH_LEN: usize = 4;

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

/// Pad bytes needed after `payload_len` bytes of payload to reach a 4-byte multiple.
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len % 4)) % 4) as u8
}

fn mismatch(opcode: Opcode, requirement: &'static str) -> PacketError {
    PacketError::HeaderMismatch {
        opcode,
        requirement,
    }
}

/// Parses the extension header at `*offset` when the opcode has it (`present`), then moves
/// `*offset` past its `len` bytes. The caller keeps the IBTA order (Vol 1 §9.2: RETH, AETH,
/// ImmDt); a `Truncated` error names the header's offset in the packet.
fn ext_header<T>(
    buf: &[u8],
    offset: &mut usize,
    present: bool,
    len: usize,
    parse: impl FnOnce(&[u8]) -> Result<T, PacketError>,
) -> Result<Option<T>, PacketError> {
    if !present {
        return Ok(None);
    }
    let rest = buf.get(*offset..).unwrap_or_default();
    let header = parse(rest).map_err(|e| at_offset(e, *offset))?;
    *offset += len;
    Ok(Some(header))
}

/// What follows the headers that end at `offset`: checks, in order, room for the ICRC, a
/// total length that is a multiple of 4 and a BTH pad count (`pad`) that fits, then returns
/// the bytes between the headers and the ICRC (`available`) and the payload without its pad.
fn payload_after(buf: &[u8], offset: usize, pad: u8) -> Result<(usize, &[u8]), PacketError> {
    check_len(buf, "ICRC", offset, ICRC_LEN)?;
    let len = buf.len();
    if len % 4 != 0 {
        return Err(PacketError::Misaligned { len });
    }
    let available = len - offset - ICRC_LEN;
    let payload_len = available
        .checked_sub(usize::from(pad))
        .ok_or(PacketError::BadPad { pad, available })?;
    let payload = buf
        .get(offset..offset + payload_len)
        .ok_or(PacketError::BadPad { pad, available })?;
    Ok((available, payload))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::psn::Psn;

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
            psn: Psn::new(0xfffffe),
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
    fn one_bth_layout_for_both_opcode_sets() {
        let uc = BthRepr {
            ack_req: true,
            solicited: true,
            pad_count: 3,
            ..bth(Opcode::RdmaWriteLast)
        };
        let rc: RcBthRepr = BthRepr {
            opcode: RcOpcode::from_uc(uc.opcode),
            solicited: uc.solicited,
            mig_req: uc.mig_req,
            pad_count: uc.pad_count,
            pkey: uc.pkey,
            fecn: uc.fecn,
            becn: uc.becn,
            dest_qpn: uc.dest_qpn,
            ack_req: uc.ack_req,
            psn: uc.psn,
        };
        let (ub, rb) = (uc.to_bytes().unwrap(), rc.to_bytes().unwrap());
        assert_eq!((ub[0], rb[0]), (0x28, 0x08));
        assert_eq!(ub[1..], rb[1..], "only the opcode byte differs");
        assert_eq!(
            &ub[8..12],
            &[0x80, 0xff, 0xff, 0xfe],
            "AckReq over the 24-bit PSN"
        );
        assert_eq!(BthRepr::<Opcode>::parse(&ub), Ok(uc));
        assert_eq!(RcBthRepr::parse(&rb), Ok(rc));
        assert_eq!(
            RcBthRepr::parse(&ub),
            Err(PacketError::NotRc { opcode: 0x28 })
        );
        assert_eq!(
            BthRepr::<Opcode>::parse(&rb),
            Err(PacketError::NotUc { opcode: 0x08 })
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
        // A PSN is 24 bits by construction: the largest fills the field and leaves AckReq.
        let mut p = repr(Opcode::SendOnly, &[]);
        p.bth.psn = Psn::MAX;
        let mut psn_out = Vec::new();
        p.emit(&mut psn_out).expect("emit");
        assert_eq!(&psn_out[8..12], &[0x00, 0xff, 0xff, 0xff]);
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
                psn: Psn::new(0xfffffe),
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
