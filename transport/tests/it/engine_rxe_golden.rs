//! The UC engine against the nine packets the Linux rxe driver sent in
//! `data/rxe-uc-golden.pcap` (kernel 6.1; sender 10.99.0.1:52215 → 10.99.0.2:4791, dest QPN
//! 0xabc, MTU 1024, first PSN 0xfffffe; payload byte `i` = `(i * 7 + 1) mod 256`):
//!
//! * requester: posting the same five WRs produces byte-identical packets (the ICRC too, once
//!   sealed with the IPv4 ID rxe used);
//! * responder: the captured packets complete the same WRs rxe's peer completed, and RDMA
//!   WRITE data lands at the captured virtual addresses.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use uctel_transport::api::{AccessFlags, Mtu, SendOpcode, UcDropReason, WcOpcode, WcStatus};
use uctel_transport::soft::engine::{
    LocalSge, RecvWqe, RtrAttr, RxOutcome, SendWqe, UcQp, UcQpConfig, VecCq,
};
use uctel_transport::soft::icrc::{self, Ipv4Ident};
use uctel_transport::soft::memory::{LocalAccessError, MemoryTable};
use uctel_transport::soft::packet::PacketRepr;

const PCAP: &[u8] = include_bytes!("../data/rxe-uc-golden.pcap");

struct Captured {
    src: SocketAddr,
    dst: SocketAddr,
    ip_id: u16,
    udp_payload: Vec<u8>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Classic little-endian pcap, Ethernet / IPv4 without options / UDP.
fn read_pcap() -> Vec<Captured> {
    assert_eq!(&PCAP[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
    let mut out = Vec::new();
    let mut off = 24;
    while off < PCAP.len() {
        let incl = u32::from_le_bytes(PCAP[off + 8..off + 12].try_into().unwrap()) as usize;
        let frame = &PCAP[off + 16..off + 16 + incl];
        off += 16 + incl;
        let ip = &frame[14..];
        assert_eq!((ip[0], ip[9]), (0x45, 17));
        let udp = &ip[20..be16(ip, 2) as usize];
        out.push(Captured {
            src: SocketAddr::from((Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]), be16(udp, 0))),
            dst: SocketAddr::from((Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]), be16(udp, 2))),
            ip_id: be16(ip, 4),
            udp_payload: udp[8..].to_vec(),
        });
    }
    out
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + 1) % 256) as u8).collect()
}

/// Memory laid out as on the captured hosts: local buffers by lkey, and one remote region
/// at virtual addresses 0..0x4000 under rkey 0x1234.
#[derive(Default)]
struct GoldenMemory {
    local: HashMap<u32, std::cell::RefCell<Vec<u8>>>,
    remote: std::cell::RefCell<Vec<u8>>,
}

const RKEY: u32 = 0x1234;

impl MemoryTable for GoldenMemory {
    fn gather(&self, lkey: u32, offset: usize, out: &mut [u8]) -> Result<(), LocalAccessError> {
        let buf = self
            .local
            .get(&lkey)
            .ok_or(LocalAccessError::NoSuchKey)?
            .borrow();
        let src = buf
            .get(offset..offset + out.len())
            .ok_or(LocalAccessError::OutOfBounds)?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn scatter(&self, lkey: u32, offset: usize, data: &[u8]) -> Result<(), LocalAccessError> {
        let mut buf = self
            .local
            .get(&lkey)
            .ok_or(LocalAccessError::NoSuchKey)?
            .borrow_mut();
        let dst = buf
            .get_mut(offset..offset + data.len())
            .ok_or(LocalAccessError::OutOfBounds)?;
        dst.copy_from_slice(data);
        Ok(())
    }
    fn check_remote_write(&self, rkey: u32, va: u64, len: u64) -> Result<(), UcDropReason> {
        if rkey != RKEY {
            return Err(UcDropReason::BadRkey);
        }
        if va + len > self.remote.borrow().len() as u64 {
            return Err(UcDropReason::OutOfBounds);
        }
        Ok(())
    }
    fn remote_write(&self, rkey: u32, va: u64, data: &[u8]) -> Result<(), UcDropReason> {
        self.check_remote_write(rkey, va, data.len() as u64)?;
        let mut r = self.remote.borrow_mut();
        r[va as usize..va as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[test]
fn requester_output_is_byte_identical_to_rxe() {
    let golden = read_pcap();
    assert_eq!(golden.len(), 9);
    let mut mem = GoldenMemory::default();
    mem.local.insert(1, std::cell::RefCell::new(pattern(2500)));
    let mut qp = UcQp::new(UcQpConfig {
        qpn: 0x11,
        max_send_wr: 8,
        max_recv_wr: 1,
    });
    qp.modify_to_init(AccessFlags::LOCAL_WRITE).unwrap();
    qp.modify_to_rtr(RtrAttr {
        dest_qpn: 0xabc,
        rq_psn: 0,
        path_mtu: Mtu::Mtu1024,
    })
    .unwrap();
    qp.modify_to_rts(0xff_fffe).unwrap();
    let sge = |length| {
        Some(LocalSge {
            lkey: 1,
            offset: 0,
            length,
        })
    };
    let wrs = [
        (SendOpcode::Send, 32),
        (SendOpcode::SendWithImm { imm: 0x0102_0304 }, 32),
        (
            SendOpcode::RdmaWriteWithImm {
                remote_addr: 0x1000,
                rkey: RKEY,
                imm: 0x0a0b_0c0d,
            },
            32,
        ),
        (
            SendOpcode::RdmaWrite {
                remote_addr: 0x2000,
                rkey: RKEY,
            },
            2500,
        ),
        (SendOpcode::SendWithImm { imm: 0x1122_3344 }, 2500),
    ];
    for (i, (opcode, len)) in wrs.into_iter().enumerate() {
        qp.post_send(SendWqe {
            wr_id: i as u64,
            opcode,
            sge: sge(len),
            signaled: true,
        })
        .unwrap();
    }
    let mut scq = VecCq::new(8);
    for (i, g) in golden.iter().enumerate() {
        let mut buf = Vec::new();
        qp.poll_transmit(&mem, &mut buf, &mut scq).expect("packet");
        let n = g.udp_payload.len();
        assert_eq!(buf.len(), n, "packet {i} length");
        assert_eq!(buf[..n - 4], g.udp_payload[..n - 4], "packet {i} BTH..pad");
        icrc::seal_with(
            &mut buf,
            g.src,
            g.dst,
            Ipv4Ident {
                id: g.ip_id,
                dont_fragment: true,
            },
        )
        .unwrap();
        assert_eq!(buf, g.udp_payload, "packet {i} with ICRC");
    }
    assert!(qp.poll_transmit(&mem, &mut Vec::new(), &mut scq).is_none());
    let ops: Vec<WcOpcode> = std::iter::from_fn(|| scq.pop()).map(|w| w.opcode).collect();
    assert_eq!(
        ops,
        [
            WcOpcode::Send,
            WcOpcode::Send,
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaWrite,
            WcOpcode::Send
        ]
    );
}

#[test]
fn responder_completes_what_rxe_sent() {
    let golden = read_pcap();
    let mut mem = GoldenMemory::default();
    for lkey in [1u32, 2, 3] {
        mem.local
            .insert(lkey, std::cell::RefCell::new(vec![0; 4096]));
    }
    *mem.remote.borrow_mut() = vec![0; 0x4000];
    let mut qp = UcQp::new(UcQpConfig {
        qpn: 0xabc,
        max_send_wr: 1,
        max_recv_wr: 8,
    });
    qp.modify_to_init(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    qp.modify_to_rtr(RtrAttr {
        dest_qpn: 0x11,
        rq_psn: 0xff_fffe,
        path_mtu: Mtu::Mtu1024,
    })
    .unwrap();
    let buf = |lkey| {
        Some(LocalSge {
            lkey,
            offset: 0,
            length: 4096,
        })
    };
    qp.post_recv(RecvWqe {
        wr_id: 10,
        sge: buf(1),
    })
    .unwrap();
    qp.post_recv(RecvWqe {
        wr_id: 11,
        sge: buf(2),
    })
    .unwrap();
    qp.post_recv(RecvWqe {
        wr_id: 12,
        sge: None,
    })
    .unwrap();
    qp.post_recv(RecvWqe {
        wr_id: 13,
        sge: buf(3),
    })
    .unwrap();
    let mut rcq = VecCq::new(8);
    for g in &golden {
        // rxe's IPv4 ID is not 0: the check infers it.
        let m = icrc::check(&g.udp_payload, g.src, g.dst).expect("ICRC");
        assert_eq!(m.ipv4_id, Some(g.ip_id));
        let pkt = PacketRepr::parse(&g.udp_payload).unwrap();
        let out = qp.receive(&pkt, &mem, &mut rcq);
        assert!(
            matches!(out, RxOutcome::Accepted | RxOutcome::Completed),
            "{out:?}"
        );
    }
    let wcs: Vec<_> = std::iter::from_fn(|| rcq.pop())
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm))
        .collect();
    assert_eq!(
        wcs,
        [
            (10, WcStatus::Success, WcOpcode::Recv, 32, None),
            (11, WcStatus::Success, WcOpcode::Recv, 32, Some(0x0102_0304)),
            (
                12,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                32,
                Some(0x0a0b_0c0d)
            ),
            (
                13,
                WcStatus::Success,
                WcOpcode::Recv,
                2500,
                Some(0x1122_3344)
            ),
        ]
    );
    assert_eq!(mem.local[&1].borrow()[..32], pattern(32)[..]);
    assert_eq!(mem.local[&3].borrow()[..2500], pattern(2500)[..]);
    let remote = mem.remote.borrow();
    assert_eq!(remote[0x1000..0x1020], pattern(32)[..]);
    assert_eq!(remote[0x2000..0x2000 + 2500], pattern(2500)[..]);
    let s = qp.stats();
    assert_eq!(
        (s.packets_received, s.messages_completed, s.psn_resyncs),
        (9, 5, 0)
    );
    assert_eq!(s.drops.total(), 0);
    assert_eq!(qp.expected_psn(), 7, "PSN wrapped from 0xfffffe through 0");
}
