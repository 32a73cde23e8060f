//! Known-answer tests against `data/rxe-uc-golden.pcap`: nine UC packets sent by the Linux
//! kernel's Soft-RoCE driver (rdma_rxe, kernel 6.1), captured on the receiving veth.
//! Layout of the capture and what was posted: see the data README shipped with the project.

use std::net::{Ipv4Addr, SocketAddr};

use uctel_transport::soft::icrc::{self, IcrcError, IcrcMatch, Ipv4Ident};
use uctel_transport::soft::packet::{Opcode, PacketRepr, DEFAULT_PKEY};

const PCAP: &[u8] = include_bytes!("../data/rxe-uc-golden.pcap");

/// One captured RoCEv2 packet.
struct Captured {
    src: SocketAddr,
    dst: SocketAddr,
    ip_id: u16,
    /// UDP payload: BTH .. ICRC.
    udp_payload: Vec<u8>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// A minimal classic-pcap reader (little-endian, microsecond, Ethernet link type) that
/// unwraps Ethernet / IPv4 (no options) / UDP.
fn read_pcap() -> Vec<Captured> {
    assert_eq!(
        &PCAP[..4],
        &[0xd4, 0xc3, 0xb2, 0xa1],
        "little-endian pcap magic"
    );
    assert_eq!(
        u32::from_le_bytes(PCAP[20..24].try_into().unwrap()),
        1,
        "Ethernet"
    );
    let mut out = Vec::new();
    let mut off = 24;
    while off < PCAP.len() {
        let incl = u32::from_le_bytes(PCAP[off + 8..off + 12].try_into().unwrap()) as usize;
        let frame = &PCAP[off + 16..off + 16 + incl];
        off += 16 + incl;
        assert_eq!(be16(frame, 12), 0x0800, "IPv4 ethertype");
        let ip = &frame[14..];
        assert_eq!(ip[0], 0x45, "IPv4 without options");
        assert_eq!(ip[9], 17, "UDP");
        let total = be16(ip, 2) as usize;
        let udp = &ip[20..total];
        let udp_len = be16(udp, 4) as usize;
        assert_eq!(udp_len, udp.len());
        let src_ip = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
        let dst_ip = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        assert_eq!(be16(ip, 6), 0x4000, "DF set, no fragment offset");
        out.push(Captured {
            src: SocketAddr::from((src_ip, be16(udp, 0))),
            dst: SocketAddr::from((dst_ip, be16(udp, 2))),
            ip_id: be16(ip, 4),
            udp_payload: udp[8..].to_vec(),
        });
    }
    out
}

fn payload_byte(i: usize) -> u8 {
    ((i * 7 + 1) % 256) as u8
}

#[test]
fn parses_all_nine_packets_as_posted() {
    let packets = read_pcap();
    assert_eq!(packets.len(), 9);
    let expect_opcodes = [0x24, 0x25, 0x2b, 0x26, 0x27, 0x28, 0x20, 0x21, 0x23];
    let expect_psn = [0xfffffe, 0xffffff, 0, 1, 2, 3, 4, 5, 6];
    // Offset of each packet's payload within its message.
    let expect_offset = [0usize, 0, 0, 0, 1024, 2048, 0, 1024, 2048];
    let expect_len = [32usize, 32, 32, 1024, 1024, 452, 1024, 1024, 452];
    for (i, p) in packets.iter().enumerate() {
        assert_eq!(
            p.src,
            "10.99.0.1:52215".parse::<SocketAddr>().unwrap(),
            "#{i}"
        );
        assert_eq!(p.dst, "10.99.0.2:4791".parse::<SocketAddr>().unwrap());
        let repr = PacketRepr::parse(&p.udp_payload).unwrap_or_else(|e| panic!("#{i}: {e}"));
        assert_eq!(repr.bth.opcode.as_u8(), expect_opcodes[i], "#{i}");
        assert_eq!(repr.bth.psn.value(), expect_psn[i], "#{i}");
        assert_eq!(repr.bth.dest_qpn, 0x000abc);
        assert_eq!(repr.bth.pkey, DEFAULT_PKEY);
        assert_eq!(repr.bth.pad_count, 0);
        assert_eq!(repr.payload.len(), expect_len[i], "#{i}");
        for (k, b) in repr.payload.iter().enumerate() {
            assert_eq!(*b, payload_byte(expect_offset[i] + k), "#{i} byte {k}");
        }
        match repr.bth.opcode {
            Opcode::SendOnlyWithImmediate => assert_eq!(repr.imm, Some(0x0102_0304)),
            Opcode::RdmaWriteOnlyWithImmediate => {
                assert_eq!(repr.imm, Some(0x0a0b_0c0d));
                let reth = repr.reth.expect("RETH");
                assert_eq!(
                    (reth.virtual_addr, reth.rkey, reth.dma_len),
                    (0x1000, 0x1234, 32)
                );
            }
            Opcode::RdmaWriteFirst => {
                let reth = repr.reth.expect("RETH");
                assert_eq!(
                    (reth.virtual_addr, reth.rkey, reth.dma_len),
                    (0x2000, 0x1234, 2500)
                );
                assert_eq!(repr.imm, None);
            }
            Opcode::SendLastWithImmediate => assert_eq!(repr.imm, Some(0x1122_3344)),
            _ => {
                assert_eq!(repr.imm, None);
                assert_eq!(repr.reth, None);
            }
        }
    }
}

#[test]
fn every_captured_icrc_verifies_with_its_ip_id() {
    for (i, p) in read_pcap().iter().enumerate() {
        assert_ne!(p.ip_id, 0, "rxe uses a hashed, non-zero IP ID");
        let with_id = icrc::compute_with(
            &p.udp_payload,
            p.src,
            p.dst,
            Ipv4Ident {
                id: p.ip_id,
                dont_fragment: true,
            },
        )
        .expect("compute");
        assert_eq!(Some(with_id), icrc::carried(&p.udp_payload), "#{i}");
        // The receive check does not know the ID and must infer it.
        assert_eq!(
            icrc::check(&p.udp_payload, p.src, p.dst),
            Ok(IcrcMatch {
                ipv4_id: Some(p.ip_id)
            }),
            "#{i}"
        );
    }
}

#[test]
fn re_emitting_each_packet_reproduces_the_capture() {
    for (i, p) in read_pcap().iter().enumerate() {
        let repr = PacketRepr::parse(&p.udp_payload).expect("parse");
        let mut out = Vec::new();
        let n = repr.emit(&mut out).expect("emit");
        assert_eq!(n, p.udp_payload.len(), "#{i}");
        icrc::seal_with(
            &mut out,
            p.src,
            p.dst,
            Ipv4Ident {
                id: p.ip_id,
                dont_fragment: true,
            },
        )
        .expect("seal");
        assert_eq!(out, p.udp_payload, "#{i}");
    }
}

#[test]
fn every_single_bit_flip_of_every_captured_packet_is_rejected() {
    for (i, p) in read_pcap().iter().enumerate() {
        let mut flipped = p.udp_payload.clone();
        for bit in 0..flipped.len() * 8 {
            let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
            if byte == 4 {
                // BTH byte 4 (FECN, BECN, resv6a) is masked out of the ICRC by design.
                continue;
            }
            flipped[byte] ^= mask;
            let result = icrc::verify(&flipped, p.src, p.dst);
            assert!(
                matches!(result, Err(IcrcError::Mismatch { .. })),
                "#{i}: flip of bit {bit} accepted: {result:?}"
            );
            flipped[byte] ^= mask;
        }
        // FECN/BECN changes in flight must not break the ICRC.
        flipped[4] ^= 0xc0;
        assert!(icrc::verify(&flipped, p.src, p.dst).is_ok(), "#{i}");
    }
}

#[test]
fn wrong_addresses_or_ports_are_rejected() {
    let p = &read_pcap()[0];
    let other_port = SocketAddr::from((Ipv4Addr::new(10, 99, 0, 1), 52216));
    let other_ip = SocketAddr::from((Ipv4Addr::new(10, 99, 0, 3), 4791));
    assert!(icrc::verify(&p.udp_payload, other_port, p.dst).is_err());
    assert!(icrc::verify(&p.udp_payload, p.src, other_ip).is_err());
    assert!(icrc::verify(&p.udp_payload, p.dst, p.src).is_err());
}
