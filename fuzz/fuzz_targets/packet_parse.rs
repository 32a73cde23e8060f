//! `PacketRepr::parse` and the ICRC check on arbitrary UDP payloads: they must never panic;
//! anything accepted must re-emit to the same bytes (BTH .. payload; reserved bits, the pad
//! content and the ICRC are regenerated), and a packet sealed after re-emitting must verify.
#![no_main]

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use uctel_transport::soft::icrc;
use uctel_transport::soft::packet::{pad_for, PacketRepr, ICRC_LEN};

fuzz_target!(|data: &[u8]| {
    let v4: (SocketAddr, SocketAddr) = (
        SocketAddr::from(([10, 99, 0, 1], 52215)),
        SocketAddr::from(([10, 99, 0, 2], 4791)),
    );
    let v6: (SocketAddr, SocketAddr) = (
        SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 1], 52215)),
        SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 2], 4791)),
    );
    // The ICRC check runs on anything, parsed or not.
    let _ = icrc::check(data, v4.0, v4.1);
    let _ = icrc::check(data, v6.0, v6.1);
    let _ = icrc::check(data, v4.0, v6.1);

    let Ok(repr) = PacketRepr::parse(data) else {
        return;
    };
    assert_eq!(repr.bth.opcode.has_reth(), repr.reth.is_some());
    assert_eq!(repr.bth.opcode.has_immdt(), repr.imm.is_some());
    let mut out = Vec::new();
    let n = repr.emit(&mut out).expect("a parsed packet re-emits");
    assert_eq!(n, data.len(), "same length");
    let body = data.len() - ICRC_LEN - usize::from(pad_for(repr.payload.len()));
    // Reserved BTH bits (resv6a in byte 4, resv7 in byte 8) are ignored on parse and sent as
    // zero; everything else must come back bit for bit.
    let mut expect = data[..body].to_vec();
    expect[4] &= 0xc0;
    expect[8] &= 0x80;
    assert_eq!(out[..body], expect[..], "same headers and payload");
    for (src, dst) in [v4, v6] {
        icrc::seal(&mut out, src, dst).expect("seal");
        assert_eq!(icrc::check(&out, src, dst).map(|m| m.ipv4_id.unwrap_or(0)), Ok(0));
    }
});
