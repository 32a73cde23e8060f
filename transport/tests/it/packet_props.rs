//! Property tests for the UC packet codec and the ICRC: emit → parse round trips for every
//! opcode and payload length, parse never panics on arbitrary bytes, sealed packets verify
//! and any single flipped bit (outside the masked BTH byte 4) is caught. The same round trip
//! and no-panic properties for the RC codec (requests and ACKNOWLEDGE with every AETH
//! syndrome).

use std::net::SocketAddr;

use proptest::prelude::*;
use uctel_transport::api::{PSN_MASK, QPN_MASK};
use uctel_transport::soft::icrc::{self, IcrcMatch, Ipv4Ident};
use uctel_transport::soft::packet::{
    pad_for, AethRepr, AethSyndrome, BthRepr, NakCode, Opcode, PacketRepr, RcBthRepr, RcOpcode,
    RcPacketRepr, RethRepr,
};
use uctel_transport::soft::psn::Psn;

fn opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

prop_compose! {
    fn bth()(
        opcode in opcode(),
        solicited: bool,
        mig_req: bool,
        pkey: u16,
        fecn: bool,
        becn: bool,
        dest_qpn in 0..=QPN_MASK,
        ack_req: bool,
        psn in 0..=PSN_MASK,
    ) -> BthRepr {
        BthRepr { opcode, solicited, mig_req, pad_count: 0, pkey, fecn, becn, dest_qpn, ack_req, psn: Psn::new(psn) }
    }
}

fn addrs(v6: bool) -> (SocketAddr, SocketAddr) {
    if v6 {
        (
            "[fd00::1]:49152".parse().expect("addr"),
            "[fd00::2]:4791".parse().expect("addr"),
        )
    } else {
        (
            "192.0.2.1:49152".parse().expect("addr"),
            "192.0.2.2:4791".parse().expect("addr"),
        )
    }
}

proptest! {
    #[test]
    fn emit_parse_round_trip(
        bth in bth(),
        reth: (u64, u32, u32),
        imm: u32,
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let repr = PacketRepr {
            bth,
            reth: bth.opcode.has_reth().then_some(RethRepr {
                virtual_addr: reth.0,
                rkey: reth.1,
                dma_len: reth.2,
            }),
            imm: bth.opcode.has_immdt().then_some(imm),
            payload: &payload,
        };
        let mut buf = Vec::new();
        let n = repr.emit(&mut buf).expect("emit");
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(n % 4, 0);
        let parsed = PacketRepr::parse(&buf).expect("parse");
        prop_assert_eq!(parsed.bth, BthRepr { pad_count: pad_for(payload.len()), ..bth });
        prop_assert_eq!(parsed.reth, repr.reth);
        prop_assert_eq!(parsed.imm, repr.imm);
        prop_assert_eq!(parsed.payload, &payload[..]);
    }

    #[test]
    fn parse_and_check_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = PacketRepr::parse(&data);
        let (a, b) = addrs(false);
        let _ = icrc::check(&data, a, b);
        let (a, b) = addrs(true);
        let _ = icrc::check(&data, a, b);
    }

    #[test]
    fn sealed_verifies_and_one_flipped_bit_does_not(
        bth in bth(),
        payload in proptest::collection::vec(any::<u8>(), 0..200),
        v6: bool,
        id: u16,
        flip: usize,
    ) {
        let repr = PacketRepr {
            bth,
            reth: bth.opcode.has_reth().then_some(RethRepr::default()),
            imm: bth.opcode.has_immdt().then_some(7),
            payload: &payload,
        };
        let mut buf = Vec::new();
        repr.emit(&mut buf).expect("emit");
        let (src, dst) = addrs(v6);
        icrc::seal_with(&mut buf, src, dst, Ipv4Ident { id, dont_fragment: true }).expect("seal");
        let expect = IcrcMatch { ipv4_id: (!v6).then_some(id) };
        prop_assert_eq!(icrc::check(&buf, src, dst), Ok(expect));
        let bit = flip % (buf.len() * 8);
        prop_assume!(bit / 8 != 4, "BTH byte 4 is masked");
        buf[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(icrc::check(&buf, src, dst).is_err());
    }

    #[test]
    fn rc_emit_parse_round_trip(
        opcode in proptest::sample::select(RcOpcode::ALL.to_vec()),
        flags: (bool, bool, bool, bool, bool),
        pkey: u16,
        dest_qpn in 0..=QPN_MASK,
        psn in 0..=PSN_MASK,
        reth: (u64, u32, u32),
        syndrome in prop_oneof![
            (0u8..32).prop_map(|credits| AethSyndrome::Ack { credits }),
            (0u8..32).prop_map(|timer| AethSyndrome::RnrNak { timer }),
            (0u8..5).prop_map(|c| AethSyndrome::Nak(NakCode::from_u8(c).expect("code"))),
        ],
        msn in 0..=PSN_MASK,
        imm: u32,
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let bth = RcBthRepr {
            opcode,
            solicited: flags.0,
            mig_req: flags.1,
            pad_count: 0,
            pkey,
            fecn: flags.2,
            becn: flags.3,
            dest_qpn,
            ack_req: flags.4,
            psn: Psn::new(psn),
        };
        let payload: &[u8] = if opcode.has_aeth() { &[] } else { &payload };
        let repr = RcPacketRepr {
            bth,
            reth: opcode.has_reth().then_some(RethRepr {
                virtual_addr: reth.0,
                rkey: reth.1,
                dma_len: reth.2,
            }),
            aeth: opcode.has_aeth().then_some(AethRepr { syndrome, msn }),
            imm: opcode.has_immdt().then_some(imm),
            payload,
        };
        let mut buf = Vec::new();
        let n = repr.emit(&mut buf).expect("emit");
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(n % 4, 0);
        let parsed = RcPacketRepr::parse(&buf).expect("parse");
        prop_assert_eq!(parsed.bth, RcBthRepr { pad_count: pad_for(payload.len()), ..bth });
        prop_assert_eq!((parsed.reth, parsed.aeth, parsed.imm), (repr.reth, repr.aeth, repr.imm));
        prop_assert_eq!(parsed.payload, payload);
        // The UC codec refuses every RC packet.
        prop_assert!(PacketRepr::parse(&buf).is_err());
    }

    #[test]
    fn rc_parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = RcPacketRepr::parse(&data);
    }
}
