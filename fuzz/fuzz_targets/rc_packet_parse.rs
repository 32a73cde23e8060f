//! `RcPacketRepr::parse` (the RC lane's packets: BTH, RETH, AETH, ImmDt, payload, pad, ICRC)
//! on arbitrary UDP payloads: it must never panic, and anything accepted must re-emit to
//! bytes that parse to the same packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_transport::soft::packet::RcPacketRepr;

fuzz_target!(|data: &[u8]| {
    let Ok(repr) = RcPacketRepr::parse(data) else {
        return;
    };
    assert_eq!(repr.bth.opcode.has_reth(), repr.reth.is_some());
    assert_eq!(repr.bth.opcode.has_immdt(), repr.imm.is_some());
    let mut out = Vec::new();
    let len = repr.emit(&mut out).expect("an accepted packet re-emits");
    assert_eq!(len, repr.buffer_len());
    assert_eq!(out.len(), len);
    let again = RcPacketRepr::parse(&out).expect("a re-emitted packet parses");
    assert_eq!(again, repr);
});
