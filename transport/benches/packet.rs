//! Per-packet cost of the soft transport's packet path: parse + ICRC verify on receive, emit +
//! ICRC seal on send, for a one-MTU SEND_ONLY_WITH_IMMEDIATE (the default frame shape) at
//! several payload sizes. IPv4 receive is measured both for ID 0 (our own sender: plain
//! compare) and for a non-zero ID (rxe sender: the ID is solved over GF(2)).

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use uctel_transport::soft::icrc::{self, Ipv4Ident};
use uctel_transport::soft::packet::{BthRepr, Opcode, PacketRepr, DEFAULT_PKEY};
use uctel_transport::soft::psn::Psn;

fn repr(payload: &[u8]) -> PacketRepr<'_> {
    PacketRepr {
        bth: BthRepr {
            opcode: Opcode::SendOnlyWithImmediate,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: 0xabc,
            ack_req: false,
            psn: Psn::new(0x12345),
        },
        reth: None,
        imm: Some(0x0102_0304),
        payload,
    }
}

fn bench(c: &mut Criterion) {
    let v4 = (
        "10.99.0.1:52215".parse::<SocketAddr>().expect("addr"),
        "10.99.0.2:4791".parse::<SocketAddr>().expect("addr"),
    );
    let v6 = (
        "[fd00::1]:52215".parse::<SocketAddr>().expect("addr"),
        "[fd00::2]:4791".parse::<SocketAddr>().expect("addr"),
    );
    let mut group = c.benchmark_group("packet");
    group.throughput(Throughput::Elements(1));
    for size in [64usize, 1024, 4096] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
        let mut sealed = Vec::new();
        repr(&payload).emit(&mut sealed).expect("emit");
        let mut sealed_v4_id0 = sealed.clone();
        icrc::seal(&mut sealed_v4_id0, v4.0, v4.1).expect("seal");
        let mut sealed_v4_rxe = sealed.clone();
        let rxe_id = Ipv4Ident {
            id: 0x3a38,
            dont_fragment: true,
        };
        icrc::seal_with(&mut sealed_v4_rxe, v4.0, v4.1, rxe_id).expect("seal");
        let mut sealed_v6 = sealed.clone();
        icrc::seal(&mut sealed_v6, v6.0, v6.1).expect("seal");

        for (name, buf, (src, dst)) in [
            ("parse_verify_v4_id0", &sealed_v4_id0, v4),
            ("parse_verify_v4_rxe_id", &sealed_v4_rxe, v4),
            ("parse_verify_v6", &sealed_v6, v6),
        ] {
            group.bench_with_input(BenchmarkId::new(name, size), buf, |b, buf| {
                b.iter(|| {
                    let p = PacketRepr::parse(black_box(buf)).expect("parse");
                    icrc::verify(buf, src, dst).expect("verify");
                    black_box(p.payload.len())
                })
            });
        }
        let mut out = Vec::with_capacity(size + 64);
        group.bench_function(BenchmarkId::new("emit_seal_v4", size), |b| {
            b.iter(|| {
                out.clear();
                repr(black_box(&payload)).emit(&mut out).expect("emit");
                icrc::seal(&mut out, v4.0, v4.1).expect("seal");
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
