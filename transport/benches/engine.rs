//! Per-packet cost of the sans-IO UC engine.
//!
//! * `requester/*`: `post_send` + `poll_transmit` (segmentation, header emit, gather from the
//!   soft MR table), and the same plus ICRC sealing;
//! * `responder/*`: what the soft device does per received 1 KiB RDMA WRITE_WITH_IMM packet:
//!   parse, ICRC verify, `receive` (PSN, op sequence, resource, length and rkey checks, data
//!   placement into the MR, completion), CQ pop and receive WR repost.
//!
//! Throughput is in packets (`Throughput::Elements`). Run briefly on shared machines:
//! `cargo bench -p uctel-transport --bench engine -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use uctel_transport::api::{AccessFlags, Mtu, SendOpcode, WcStatus};
use uctel_transport::soft::engine::{
    LocalSge, RecvWqe, RtrAttr, RxOutcome, SendWqe, UcQp, UcQpConfig, VecCq,
};
use uctel_transport::soft::icrc;
use uctel_transport::soft::memory::MrTable;
use uctel_transport::soft::packet::PacketRepr;

const FRAME: u32 = 1024;

fn qp(qpn: u32, dest: u32, sq_psn: u32, rq_psn: u32, mtu: Mtu) -> UcQp {
    let mut qp = UcQp::new(UcQpConfig {
        qpn,
        max_send_wr: 1024,
        max_recv_wr: 1024,
    });
    qp.modify_to_init(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .expect("init");
    qp.modify_to_rtr(RtrAttr {
        dest_qpn: dest,
        rq_psn,
        path_mtu: mtu,
    })
    .expect("rtr");
    qp.modify_to_rts(sq_psn).expect("rts");
    qp
}

fn addrs() -> (SocketAddr, SocketAddr) {
    (
        "10.0.0.1:4791".parse().expect("addr"),
        "10.0.0.2:4791".parse().expect("addr"),
    )
}

fn requester(c: &mut Criterion) {
    let mem = MrTable::new();
    let src = mem
        .register(64 * 1024, AccessFlags::LOCAL_WRITE)
        .expect("mr");
    src.write_at(0, &[0x5a; 64 * 1024]).expect("fill");
    let (a, b) = addrs();
    let mut g = c.benchmark_group("requester");

    for (name, len, mtu, packets, seal) in [
        ("wwi_1k_one_packet", FRAME, Mtu::Mtu1024, 1u64, false),
        ("wwi_1k_one_packet_sealed", FRAME, Mtu::Mtu1024, 1, true),
        ("write_16k_at_mtu_4096", 16 * 1024, Mtu::Mtu4096, 4, false),
        ("send_3000_at_mtu_1024", 3000, Mtu::Mtu1024, 3, false),
    ] {
        g.throughput(Throughput::Elements(packets));
        let mut q = qp(0x11, 0x22, 0, 0, mtu);
        let mut scq = VecCq::new(1 << 20);
        let mut buf = Vec::with_capacity(4200);
        let mut seq = 0u32;
        g.bench_function(name, |bench| {
            bench.iter(|| {
                seq = seq.wrapping_add(1);
                let opcode = if len == 3000 {
                    SendOpcode::Send
                } else {
                    SendOpcode::RdmaWriteWithImm {
                        remote_addr: 0x1000,
                        rkey: 0x1234,
                        imm: seq,
                    }
                };
                q.post_send(SendWqe {
                    wr_id: u64::from(seq),
                    opcode,
                    sge: Some(LocalSge {
                        lkey: src.key(),
                        offset: 0,
                        length: len,
                    }),
                    signaled: false,
                })
                .expect("post");
                for _ in 0..packets {
                    let info = q.poll_transmit(&mem, &mut buf, &mut scq).expect("packet");
                    if seal {
                        icrc::seal(&mut buf, a, b).expect("seal");
                    }
                    black_box((&info, &buf));
                }
            });
        });
    }
    g.finish();
}

/// `n` sealed 1 KiB WRITE_WITH_IMM packets with consecutive PSNs from 0, addressed to the
/// ring `rkey` at `va`.
fn wwi_packets(n: u32, va: u64, rkey: u32) -> Vec<Vec<u8>> {
    let mem = MrTable::new();
    let src = mem
        .register(FRAME as usize, AccessFlags::LOCAL_WRITE)
        .expect("mr");
    src.write_at(0, &[0xa5; FRAME as usize]).expect("fill");
    let mut q = qp(0x11, 0x22, 0, 0, Mtu::Mtu1024);
    let mut scq = VecCq::new(1);
    let (a, b) = addrs();
    (0..n)
        .map(|i| {
            q.post_send(SendWqe {
                wr_id: 0,
                opcode: SendOpcode::RdmaWriteWithImm {
                    remote_addr: va + u64::from(i % 64) * u64::from(FRAME),
                    rkey,
                    imm: i,
                },
                sge: Some(LocalSge {
                    lkey: src.key(),
                    offset: 0,
                    length: FRAME,
                }),
                signaled: false,
            })
            .expect("post");
            let mut buf = Vec::new();
            q.poll_transmit(&mem, &mut buf, &mut scq).expect("packet");
            icrc::seal(&mut buf, a, b).expect("seal");
            buf
        })
        .collect()
}

fn responder(c: &mut Criterion) {
    let mem = MrTable::new();
    let ring = mem
        .register(
            64 * FRAME as usize,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("ring");
    const N: u32 = 4096;
    let pkts = wwi_packets(N, ring.addr(), ring.key());
    let (a, b) = addrs();
    let mut g = c.benchmark_group("responder");
    g.throughput(Throughput::Elements(1));

    for (name, verify) in [
        ("wwi_1k_receive", false),
        ("wwi_1k_parse_icrc_receive", true),
    ] {
        let mut q = qp(0x22, 0x11, 0, 0, Mtu::Mtu1024);
        let mut rcq = VecCq::new(4);
        for _ in 0..1024 {
            q.post_recv(RecvWqe {
                wr_id: 1,
                sge: None,
            })
            .expect("recv wr");
        }
        let mut i = 0usize;
        g.bench_function(name, |bench| {
            bench.iter(|| {
                // Cycling back to PSN 0 every N packets is one resync: a start packet, accepted.
                let p = &pkts[i % pkts.len()];
                i += 1;
                if verify {
                    icrc::verify(p, a, b).expect("icrc");
                }
                let repr = PacketRepr::parse(p).expect("parse");
                let out = q.receive(&repr, &mem, &mut rcq);
                debug_assert_eq!(out, RxOutcome::Completed);
                let wc = rcq.pop().expect("completion");
                debug_assert_eq!(wc.status, WcStatus::Success);
                q.post_recv(RecvWqe {
                    wr_id: wc.wr_id,
                    sge: None,
                })
                .expect("repost");
                black_box(out)
            });
        });
    }

    // The whole receive path batch-wise, as the device runs it: 64 packets per iteration.
    let mut q = qp(0x22, 0x11, 0, 0, Mtu::Mtu1024);
    let mut rcq = VecCq::new(128);
    for _ in 0..1024 {
        q.post_recv(RecvWqe {
            wr_id: 1,
            sge: None,
        })
        .expect("recv wr");
    }
    g.throughput(Throughput::Elements(64));
    let mut start = 0usize;
    g.bench_function("wwi_1k_batch_of_64", |bench| {
        bench.iter_batched(
            || {
                let s = start;
                start = (start + 64) % pkts.len();
                s
            },
            |s| {
                for p in &pkts[s..s + 64] {
                    icrc::verify(p, a, b).expect("icrc");
                    let repr = PacketRepr::parse(p).expect("parse");
                    black_box(q.receive(&repr, &mem, &mut rcq));
                }
                while let Some(wc) = rcq.pop() {
                    q.post_recv(RecvWqe {
                        wr_id: wc.wr_id,
                        sge: None,
                    })
                    .expect("repost");
                }
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

criterion_group!(benches, requester, responder);
criterion_main!(benches);
