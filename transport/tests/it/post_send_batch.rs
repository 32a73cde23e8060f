//! `post_send_batch` on the soft transport over real UDP on 127.0.0.1: one RDMA WRITE on
//! each of N QPs, each QP connected to a peer of its own (its own device and UDP port), goes
//! to the link in one transmit submission (one `sendmmsg(2)` for different destinations),
//! where posting them one by one takes N; a batch larger than the link's batch takes one
//! submission per link batch. Every write lands in its peer's memory.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use uctel_transport::api::{
    post_send_batch, AccessFlags, Device, MemoryRegion, QpInitAttr, QpSendList, QpType, QueuePair,
    SendWr, Sge,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::udp::UdpConfig;

const PEERS: usize = 8;
const WORD: usize = 40;

fn soft(batch: usize) -> SoftDevice {
    let bind: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let config = SoftConfig {
        udp: UdpConfig::bound_to(bind),
        batch,
        progress: ProgressMode::BusyPoll,
        ..SoftConfig::default()
    };
    SoftDevice::open(&config).expect("open soft device")
}

/// One sending device with `PEERS` UC QPs, each connected to a QP on a device of its own
/// whose MR takes RDMA WRITEs; `batch`: the sender's link batch.
struct Fleet {
    soft: SoftDevice,
    qps: Vec<QueuePair>,
    src: MemoryRegion,
    peers: Vec<(SoftDevice, QueuePair, MemoryRegion)>,
    _keep: Vec<uctel_transport::api::CompletionQueue>,
}

fn fleet(batch: usize) -> Fleet {
    let soft_tx = soft(batch);
    let tx = Device::from(soft_tx.clone());
    let pd = tx.alloc_pd().expect("pd");
    let cq = tx.create_cq(256).expect("cq");
    let src = pd
        .reg_mr(PEERS * 64, AccessFlags::LOCAL_WRITE)
        .expect("source mr");
    let mut qps = Vec::new();
    let mut peers = Vec::new();
    let mut keep = vec![cq.clone()];
    for _ in 0..PEERS {
        let soft_rx = soft(64);
        let rx = Device::from(soft_rx.clone());
        let rx_pd = rx.alloc_pd().expect("pd");
        let rx_cq = rx.create_cq(16).expect("cq");
        let uc = |pd: &uctel_transport::api::ProtectionDomain,
                  cq: &uctel_transport::api::CompletionQueue,
                  access| {
            pd.create_qp(&QpInitAttr {
                qp_type: QpType::Uc,
                send_cq: cq,
                recv_cq: cq,
                max_send_wr: 16,
                max_recv_wr: 1,
                access,
                max_mtu: None,
            })
            .expect("qp")
        };
        let tx_qp = uc(&pd, &cq, AccessFlags::LOCAL_WRITE);
        let rx_qp = uc(
            &rx_pd,
            &rx_cq,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        let mr = rx_pd
            .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("peer mr");
        tx_qp.connect(&rx_qp.local_endpoint()).expect("connect");
        rx_qp.connect(&tx_qp.local_endpoint()).expect("connect");
        qps.push(tx_qp);
        keep.push(rx_cq);
        peers.push((soft_rx, rx_qp, mr));
    }
    Fleet {
        soft: soft_tx,
        qps,
        src,
        peers,
        _keep: keep,
    }
}

impl Fleet {
    /// One unsignaled 40-byte WRITE per QP of byte `fill`, the i-th from line i of the source.
    fn wrs(&self, fill: u8) -> Vec<SendWr<'_>> {
        (0..PEERS)
            .map(|i| {
                self.src
                    .write_at(i * 64, &[fill.wrapping_add(i as u8); WORD])
                    .expect("source write");
                let (_, _, mr) = &self.peers[i];
                SendWr::write(
                    i as u64,
                    Some(Sge::new(&self.src, i * 64, WORD as u32)),
                    mr.addr(),
                    mr.rkey(),
                )
                .with_signaled(false)
            })
            .collect()
    }

    /// Drives every peer until each one's MR holds its write of `fill` (bounded).
    fn wait_landed(&self, fill: u8) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut landed = [false; PEERS];
        while !landed.iter().all(|l| *l) {
            assert!(
                Instant::now() < deadline,
                "writes of {fill} landed: {landed:?}"
            );
            for (i, (soft, _, mr)) in self.peers.iter().enumerate() {
                soft.progress();
                let mut got = [0u8; WORD];
                mr.read_at(0, &mut got).expect("read");
                landed[i] = got == [fill.wrapping_add(i as u8); WORD];
            }
        }
    }
}

/// Datagrams the device handed to its link.
fn sent(soft: &SoftDevice) -> u64 {
    Device::from(soft.clone()).stats().packets_sent
}

#[test]
fn writes_to_many_peers_leave_in_one_link_submission() {
    let f = fleet(64);
    // One by one: a transmit submission per QP.
    let wrs = f.wrs(1);
    let (sends, packets) = (f.soft.link_sends(), sent(&f.soft));
    for (qp, wr) in f.qps.iter().zip(&wrs) {
        qp.post_send(std::slice::from_ref(wr)).expect("post");
    }
    assert_eq!(f.soft.link_sends() - sends, PEERS as u64);
    assert_eq!(sent(&f.soft) - packets, PEERS as u64);
    f.wait_landed(1);

    // Batched: one submission for all of them, to 8 different destinations.
    let wrs = f.wrs(101);
    let lists: Vec<QpSendList<'_, '_>> = f
        .qps
        .iter()
        .zip(&wrs)
        .map(|(qp, wr)| QpSendList {
            qp,
            wrs: std::slice::from_ref(wr),
        })
        .collect();
    let (sends, packets) = (f.soft.link_sends(), sent(&f.soft));
    let results = post_send_batch(&lists);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(f.soft.link_sends() - sends, 1, "one sendmmsg for the batch");
    assert_eq!(sent(&f.soft) - packets, PEERS as u64);
    f.wait_landed(101);
}

#[test]
fn a_batch_larger_than_the_link_batch_takes_one_submission_per_link_batch() {
    let f = fleet(3);
    let wrs = f.wrs(7);
    let lists: Vec<QpSendList<'_, '_>> = f
        .qps
        .iter()
        .zip(&wrs)
        .map(|(qp, wr)| QpSendList {
            qp,
            wrs: std::slice::from_ref(wr),
        })
        .collect();
    let sends = f.soft.link_sends();
    let results = post_send_batch(&lists);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    // 8 datagrams, 3 per sendmmsg: 3 submissions.
    assert_eq!(f.soft.link_sends() - sends, PEERS.div_ceil(3) as u64);
    f.wait_landed(7);
}

#[test]
fn a_refused_list_does_not_stop_the_others() {
    let f = fleet(64);
    f.qps[2].modify_to_error();
    let wrs = f.wrs(50);
    let lists: Vec<QpSendList<'_, '_>> = f
        .qps
        .iter()
        .zip(&wrs)
        .map(|(qp, wr)| QpSendList {
            qp,
            wrs: std::slice::from_ref(wr),
        })
        .collect();
    let sends = f.soft.link_sends();
    let results = post_send_batch(&lists);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.is_ok(), i != 2, "list {i}: {r:?}");
    }
    assert_eq!(f.soft.link_sends() - sends, 1);
}
