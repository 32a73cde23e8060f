//! The agent's data plane on one lane of a connection: a UC QP (or, for the streams set to
//! `reliability: rc`, an RC QP: DESIGN.md §8b) on the configured transport, a registered send
//! buffer pool, and the two ways a frame reaches the collector (DESIGN.md §4):
//!
//! - `write_with_imm`: RDMA WRITE_WITH_IMM of the frame with connection sequence `c` to
//!   `ring_addr + (c mod slots) × slot_bytes` under the ring's rkey; the immediate is the low
//!   32 bits of `c` ([`conn_seq_immediate`]);
//! - `send`: a SEND of the frame into a receive buffer the collector posted.
//!
//! A send buffer is reused only after its send completion was polled (the transport may read
//! it until then; on RC the completion comes with the collector's ACK). No free buffer, or a full send queue, is a cheap [`PostOutcome::Busy`]; the
//! pipeline keeps the frame and tries again (UC never retransmits, but not having posted yet
//! is not a retransmission).

use std::net::{IpAddr, SocketAddr};

use std::sync::Arc;
use uctel_protocol::control::{self, Welcome};
use uctel_protocol::frame::conn_seq_immediate;
use uctel_transport::api::{
    self, AccessFlags, CompletionQueue, Device, MemoryRegion, QpInitAttr, QpState, QpType,
    QueuePair, RcCounters, SendWr, Sge, WcStatus, WorkCompletion,
};
use uctel_transport::device::{DeviceConfig, VerbsConfig};

use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::fault::FaultStats;
use uctel_transport::soft::udp::UdpConfig;

use crate::config::{faults_enabled, AgentConfig, DataPath, TransportKind};
use crate::rdma_events::{drain_async_events, AsyncEventKind, RdmaEventMetrics};
use crate::sender::core::Transmit;
use crate::sender::pump::{FrameSink, PostOutcome};

/// Send work requests outstanding on the QP (and send buffers in the pool).
pub const SEND_QUEUE_DEPTH: u32 = 256;

/// Why the data plane could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// Opening the device failed.
    #[error("opening the {kind} transport: {detail}")]
    Open {
        /// `soft` or `verbs`.
        kind: &'static str,
        /// What failed.
        detail: String,
    },
    /// Creating a PD, CQ, MR or QP failed.
    #[error("creating the {what}: {detail}")]
    Resource {
        /// Which object.
        what: &'static str,
        /// What failed.
        detail: String,
    },
    /// The collector's endpoint could not be used.
    #[error("connecting the {qp} to the collector: {detail}")]
    Connect {
        /// `UC QP` or `RC QP`.
        qp: &'static str,
        /// What failed.
        detail: String,
    },
}

/// `"UC QP"` or `"RC QP"`, for errors and logs.
pub fn qp_name(qp_type: &QpType) -> &'static str {
    match qp_type {
        QpType::Uc => "UC QP",
        QpType::Rc(_) => "RC QP",
    }
}

/// Where frames go on the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingTarget {
    /// Ring base virtual address (RETH VA of slot 0).
    pub addr: u64,
    /// The ring MR's rkey.
    pub rkey: u32,
    /// Slots in the ring.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: u32,
}

impl RingTarget {
    /// From the collector's `Welcome`.
    pub fn from_welcome(w: &Welcome) -> Self {
        Self {
            addr: w.ring_addr,
            rkey: w.rkey,
            slots: w.slots,
            slot_bytes: w.slot_bytes,
        }
    }

    /// From the collector's `Welcome`, for the RC lane (`Welcome.rc_lane`): the lane's ring,
    /// with the connection's slot size.
    pub fn from_rc_lane(lane: &control::RcLane, slot_bytes: u32) -> Self {
        Self {
            addr: lane.ring_addr,
            rkey: lane.rkey,
            slots: lane.slots,
            slot_bytes,
        }
    }

    /// The remote address of the slot of connection sequence `conn_seq`
    /// (`addr + (conn_seq mod slots) × slot_bytes`).
    pub fn slot_addr(&self, conn_seq: u64) -> u64 {
        let slot = conn_seq % u64::from(self.slots.max(1));
        self.addr
            .wrapping_add(slot.wrapping_mul(u64::from(self.slot_bytes)))
    }
}

/// The QP and its resources for one connection.
#[derive(Debug)]
pub struct DataPlane {
    device: Device,
    qp: QueuePair,
    /// `UC QP` or `RC QP`.
    qp_name: &'static str,
    send_cq: CompletionQueue,
    // Kept alive with the QP: the agent receives nothing, but the QP needs a receive CQ.
    _recv_cq: CompletionQueue,
    mr: MemoryRegion,
    /// The credit word region (DESIGN.md §4): REMOTE_WRITE, the collector writes the
    /// agent's credit into it (`crate::credits::CreditReader`).
    credit_mr: MemoryRegion,
    buf_bytes: usize,
    free: Vec<usize>,
    ring: Option<RingTarget>,
    wcs: Vec<WorkCompletion>,
    completion_errors: u64,
    /// Status of the first completion that failed.
    first_error: Option<WcStatus>,
    /// Connection sequence of the frame posted from each send buffer.
    posted_seq: Vec<u64>,
    /// Highest connection sequence whose send completed successfully since the last
    /// [`DataPlane::take_acked`].
    acked: Option<u64>,
    fault_stats: Option<Arc<FaultStats>>,
    /// The device is another plane's ([`DataPlane::open_beside`]), which takes its async
    /// events.
    shares_device: bool,
}

/// Maps the agent's transport settings to a device configuration. `local_ip` is the local
/// address of the control connection; the soft device binds an ephemeral port on it unless
/// `transport.soft.bind` says otherwise.
///
/// With a stream on `reliability: rc` the soft device runs its progress thread: an RC
/// requester must take ACKs and run its retransmit timer (IBTA 9.7.6) while the sender
/// waits. The RC lane's QP lives on the same soft device as the UC QP
/// ([`DataPlane::open_beside`]): a verbs peer (rxe, a NIC) answers RC requests on UDP port
/// 4791 of the requester's address, never on another port, so both QPs share the device's
/// socket.
pub fn device_config(config: &AgentConfig, local_ip: IpAddr) -> DeviceConfig {
    let rc = !config.streams.rc_streams().is_empty();
    match config.transport.kind {
        TransportKind::Soft => {
            let soft = &config.transport.soft;
            DeviceConfig::Soft(SoftConfig {
                name: "uctel-agent".to_owned(),
                udp: UdpConfig {
                    bind: soft.bind.unwrap_or(SocketAddr::new(local_ip, 0)),
                    // The agent sends; a small receive buffer is plenty, and no 64 KiB
                    // UDP_GRO receive slots. Sends use UDP_SEGMENT (the default).
                    recv_buffer_bytes: Some(256 << 10),
                    gro: false,
                    ..UdpConfig::default()
                },
                mtu_bytes: soft.mtu_bytes,
                // UC only: no progress thread: the agent only sends, `post_send` transmits at
                // once, and the sender's completion polling (`reap`) drives the device. Saves
                // a thread waking every `progress_wait_micros` on every host.
                progress: if rc {
                    ProgressMode::Thread
                } else {
                    ProgressMode::BusyPoll
                },
                faults: faults_enabled(&soft.fault).then(|| soft.fault.clone()),
                ..SoftConfig::default()
            })
        }
        TransportKind::Verbs => DeviceConfig::Verbs(VerbsConfig {
            device: config.transport.verbs.device.clone(),
            port_num: config.transport.verbs.port,
            gid_index: config
                .transport
                .verbs
                .gid_index
                .and_then(|g| u8::try_from(g).ok()),
            local_ip: Some(local_ip),
        }),
    }
}

/// Opens the device; for a soft device with fault injection also returns the injector's
/// counters.
fn open_device(
    config: &AgentConfig,
    local_ip: IpAddr,
) -> Result<(Device, Option<Arc<FaultStats>>), DataPlaneError> {
    let kind = match config.transport.kind {
        TransportKind::Soft => "soft",
        TransportKind::Verbs => "verbs",
    };
    let open_error = |e: uctel_transport::api::OpenError| DataPlaneError::Open {
        kind,
        detail: e.to_string(),
    };
    match device_config(config, local_ip) {
        DeviceConfig::Soft(sc) => {
            if let Some(f) = &sc.faults {
                tracing::warn!(fault = %f, "soft transport fault injection is ON (lab setting)");
            }
            let soft = SoftDevice::open(&sc).map_err(open_error)?;
            let faults = soft.fault_stats();
            Ok((Device::from(soft), faults))
        }
        dc => Device::open(&dc).map(|d| (d, None)).map_err(open_error),
    }
}

fn resource(what: &'static str) -> impl Fn(String) -> DataPlaneError {
    move |detail| DataPlaneError::Resource { what, detail }
}

impl DataPlane {
    /// Opens the device and creates the QP of type `qp_type` (in INIT: UC, or RC with its
    /// retry attributes), its CQs and a pool of [`SEND_QUEUE_DEPTH`] send buffers of
    /// `max_frame_bytes` each.
    ///
    /// # Errors
    /// [`DataPlaneError`] naming the object that could not be created.
    pub fn open(
        config: &AgentConfig,
        local_ip: IpAddr,
        max_frame_bytes: usize,
        qp_type: QpType,
    ) -> Result<DataPlane, DataPlaneError> {
        let (device, fault_stats) = open_device(config, local_ip)?;
        DataPlane::build(device, fault_stats, false, max_frame_bytes, qp_type)
    }

    /// A second QP of type `qp_type` (the RC lane's) on this plane's device, with CQs and
    /// send buffers of its own: on the soft transport both QPs then share the device's UDP
    /// socket (the port a verbs peer answers RC requests on, [`device_config`]). The fault
    /// injector and the device's async events stay with this plane (counted once); the new
    /// plane sees its QP's failures by its completions and its state.
    ///
    /// # Errors
    /// [`DataPlaneError`] naming the object that could not be created.
    pub fn open_beside(
        &self,
        max_frame_bytes: usize,
        qp_type: QpType,
    ) -> Result<DataPlane, DataPlaneError> {
        DataPlane::build(self.device.clone(), None, true, max_frame_bytes, qp_type)
    }

    fn build(
        device: Device,
        fault_stats: Option<Arc<FaultStats>>,
        shares_device: bool,
        max_frame_bytes: usize,
        qp_type: QpType,
    ) -> Result<DataPlane, DataPlaneError> {
        let qp_name = qp_name(&qp_type);
        let pd = device
            .alloc_pd()
            .map_err(|e| resource("protection domain")(e.to_string()))?;
        let send_cq = device
            .create_cq(SEND_QUEUE_DEPTH)
            .map_err(|e| resource("send CQ")(e.to_string()))?;
        let recv_cq = device
            .create_cq(16)
            .map_err(|e| resource("receive CQ")(e.to_string()))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                max_send_wr: SEND_QUEUE_DEPTH,
                max_recv_wr: 1,
                // Inbound RDMA WRITE is allowed for the credit word region only: it is the
                // one region registered with REMOTE_WRITE (IBTA §10.6.3.2).
                access: AccessFlags::REMOTE_WRITE,
                max_mtu: None,
            })
            .map_err(|e| resource(qp_name)(e.to_string()))?;
        let buf_bytes = max_frame_bytes.max(1);
        let mr = pd
            .reg_mr(
                buf_bytes * SEND_QUEUE_DEPTH as usize,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(|e| resource("send buffer MR")(e.to_string()))?;
        // Remote write needs local write too (IBTA §10.6.3.1, `ibv_reg_mr`'s EINVAL).
        let credit_mr = pd
            .reg_mr(
                control::CREDIT_MR_BYTES as usize,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .map_err(|e| resource("credit word MR")(e.to_string()))?;
        Ok(DataPlane {
            device,
            qp,
            qp_name,
            send_cq,
            _recv_cq: recv_cq,
            mr,
            credit_mr,
            buf_bytes,
            free: (0..SEND_QUEUE_DEPTH as usize).rev().collect(),
            ring: None,
            wcs: vec![WorkCompletion::default(); 64],
            completion_errors: 0,
            first_error: None,
            posted_seq: vec![0; SEND_QUEUE_DEPTH as usize],
            acked: None,
            fault_stats,
            shares_device,
        })
    }

    /// The transport of the QP, as the control protocol names it.
    pub fn transport(&self) -> control::Transport {
        match self.device.kind() {
            api::TransportKind::Soft => control::Transport::Soft,
            api::TransportKind::Verbs => control::Transport::Verbs,
        }
    }

    /// The QP's endpoint for `Hello`.
    pub fn endpoint(&self) -> control::QpEndpoint {
        let e = self.qp.local_endpoint();
        control::QpEndpoint {
            gid: e.gid.to_vec(),
            qpn: e.qpn,
            psn: e.psn,
            mtu: e.mtu,
            udp_addr: e.udp_addr.map(|a| a.to_string()).unwrap_or_default(),
        }
    }

    /// The credit word region, for `Hello.credit_mr` (DESIGN.md §4).
    pub fn credit_mr(&self) -> &MemoryRegion {
        &self.credit_mr
    }

    /// `UC QP` or `RC QP`.
    pub fn qp_name(&self) -> &'static str {
        self.qp_name
    }

    /// Connects the QP (INIT → RTR → RTS) to the collector's endpoint from `welcome` and
    /// remembers its ring.
    ///
    /// # Errors
    /// [`DataPlaneError::Connect`] for an unusable endpoint or a refused transition.
    pub fn connect(&mut self, welcome: &Welcome) -> Result<(), DataPlaneError> {
        self.connect_to(welcome.qp.as_ref(), RingTarget::from_welcome(welcome))
    }

    /// Connects the RC lane's QP to the collector's RC QP from `Welcome.rc_lane` and
    /// remembers the lane's ring (its slots; the slot size is the connection's).
    ///
    /// # Errors
    /// [`DataPlaneError::Connect`] when `welcome` has no RC lane, for an unusable endpoint
    /// or a refused transition.
    pub fn connect_rc_lane(&mut self, welcome: &Welcome) -> Result<(), DataPlaneError> {
        let lane = welcome
            .rc_lane
            .as_ref()
            .ok_or_else(|| DataPlaneError::Connect {
                qp: self.qp_name,
                detail: "Welcome has no RC lane".into(),
            })?;
        self.connect_to(
            lane.qp.as_ref(),
            RingTarget::from_rc_lane(lane, welcome.slot_bytes),
        )
    }

    fn connect_to(
        &mut self,
        qp: Option<&control::QpEndpoint>,
        ring: RingTarget,
    ) -> Result<(), DataPlaneError> {
        let error = |detail: String| DataPlaneError::Connect {
            qp: self.qp_name,
            detail,
        };
        let qp = qp.ok_or_else(|| error("Welcome has no QP endpoint".into()))?;
        let gid = qp
            .gid_array()
            .ok_or_else(|| error("GID is not 16 bytes".into()))?;
        let remote = api::QpEndpoint {
            gid,
            qpn: qp.qpn,
            psn: qp.psn,
            mtu: qp.mtu,
            udp_addr: qp.udp_socket_addr(),
        };
        self.qp.connect(&remote).map_err(|e| error(e.to_string()))?;
        self.ring = Some(ring);
        Ok(())
    }

    /// Polls send completions and returns their buffers to the pool. Returns how many
    /// completions carried an error status (the QP is then in ERROR).
    pub fn reap(&mut self) -> u64 {
        let mut errors = 0;
        loop {
            let n = self.send_cq.poll(&mut self.wcs);
            for wc in self.wcs.iter().take(n) {
                if let Ok(slot) = usize::try_from(wc.wr_id) {
                    if slot < SEND_QUEUE_DEPTH as usize && !self.free.contains(&slot) {
                        self.free.push(slot);
                    }
                }
                if wc.status == WcStatus::Success {
                    let seq = usize::try_from(wc.wr_id)
                        .ok()
                        .and_then(|slot| self.posted_seq.get(slot).copied());
                    if let Some(seq) = seq {
                        self.acked = Some(self.acked.map_or(seq, |a| a.max(seq)));
                    }
                } else {
                    errors += 1;
                    self.first_error.get_or_insert(wc.status);
                }
            }
            if n < self.wcs.len() {
                break;
            }
        }
        self.completion_errors += errors;
        errors
    }

    /// The highest connection sequence whose send completed successfully since the last
    /// call (completions are taken by [`DataPlane::reap`]). On an RC QP a successful send
    /// completion means the responder acknowledged the message (IBTA 9.7.5.1, rxe
    /// `rxe_comp.c`), and the sends complete in order; on UC it only means the message left.
    pub fn take_acked(&mut self) -> Option<u64> {
        self.acked.take()
    }

    /// Whether the QP fell into ERROR (e.g. a failed send completion): the connection must
    /// be rebuilt (DESIGN.md §2).
    pub fn failed(&self) -> bool {
        self.qp.state() == QpState::Error
    }

    /// Takes the device's pending async events (non-blocking), counts and logs them in
    /// `metrics`; returns the kind of the first one that ends the session
    /// ([`crate::rdma_events::drain_async_events`]).
    /// None on a plane that shares another's device ([`DataPlane::open_beside`]).
    pub fn poll_async_events(&self, metrics: &RdmaEventMetrics) -> Option<AsyncEventKind> {
        if self.shares_device {
            return None;
        }
        drain_async_events(&self.device, metrics)
    }

    /// The status of the first send completion that failed on this QP (e.g.
    /// `retry_exceeded_error` when an RC QP's `retry_cnt` ran out), `None` while none did.
    pub fn first_error(&self) -> Option<WcStatus> {
        self.first_error
    }

    /// What the QP did to deliver, RC only: retransmissions, timeouts, NAKs, retry
    /// exhaustion (this QP's counts since it was created; all zero on a UC QP and on the
    /// verbs transport, whose devices count these per port).
    pub fn rc_counters(&self) -> RcCounters {
        self.qp.stats().rc
    }

    /// Send buffers free now.
    pub fn free_buffers(&self) -> usize {
        self.free.len()
    }

    /// The counters of the soft transport's fault injector, when it has one
    /// (`transport.soft.fault`); `None` otherwise.
    pub fn fault_stats(&self) -> Option<Arc<FaultStats>> {
        self.fault_stats.clone()
    }

    /// Sends at once what the device still holds, a soft device's fault injector
    /// included ([`Device::flush_link`]): for a session that ends, after its last send
    /// completed and before the injector's figures are read.
    pub fn flush_link(&self) {
        self.device.flush_link();
    }

    /// Whether every posted send has completed.
    pub fn idle(&self) -> bool {
        self.free.len() == SEND_QUEUE_DEPTH as usize
    }
}

impl FrameSink for DataPlane {
    fn post(&mut self, t: &Transmit) -> PostOutcome {
        if self.free.is_empty() {
            self.reap();
        }
        let Some(ring) = self.ring else {
            return PostOutcome::Failed;
        };
        if t.bytes.len() > self.buf_bytes
            || (t.data_path == DataPath::WriteWithImm && t.bytes.len() > ring.slot_bytes as usize)
        {
            // The pipeline never builds such a frame; refuse rather than overrun a slot.
            return PostOutcome::Failed;
        }
        let Some(slot) = self.free.pop() else {
            return PostOutcome::Busy;
        };
        let offset = slot * self.buf_bytes;
        if let Some(s) = self.posted_seq.get_mut(slot) {
            *s = t.conn_seq;
        }
        if self.mr.write_at(offset, &t.bytes).is_err() {
            self.free.push(slot);
            return PostOutcome::Failed;
        }
        let Ok(len) = u32::try_from(t.bytes.len()) else {
            self.free.push(slot);
            return PostOutcome::Failed;
        };
        let sge = Some(Sge::new(&self.mr, offset, len));
        let wr = match t.data_path {
            DataPath::WriteWithImm => SendWr::write_with_imm(
                slot as u64,
                sge,
                ring.slot_addr(t.conn_seq),
                ring.rkey,
                conn_seq_immediate(t.conn_seq),
            ),
            DataPath::Send => SendWr::send(slot as u64, sge),
        };
        match self.qp.post_send(&[wr]) {
            Ok(()) => PostOutcome::Posted,
            Err(e) if e.is_full() => {
                self.free.push(slot);
                PostOutcome::Busy
            }
            Err(e) => {
                self.free.push(slot);
                tracing::warn!(error = %e, "post_send failed");
                PostOutcome::Failed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uctel_transport::api::RcAttr;

    fn config(extra: &str) -> AgentConfig {
        let text =
            format!("agent_id: a\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n{extra}");
        AgentConfig::from_yaml("t.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_rc_stream_gives_the_soft_device_a_progress_thread_on_the_same_port() {
        let text = "transport:\n  soft:\n    bind: 127.0.0.1:4791\n    fault: { drop_ratio: 0.5, seed: 3 }\n";
        let ip = "127.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        let (DeviceConfig::Soft(uc), DeviceConfig::Soft(rc)) = (
            device_config(&config(text), ip),
            device_config(
                &config(&format!("{text}streams:\n  logs:\n    reliability: rc\n")),
                ip,
            ),
        ) else {
            panic!("soft transport expected");
        };
        assert_eq!((uc.udp.bind.port(), rc.udp.bind.port()), (4791, 4791));
        assert_eq!(uc.progress, ProgressMode::BusyPoll);
        assert_eq!(rc.progress, ProgressMode::Thread);
        assert_eq!(uc.faults, rc.faults);
        assert!(rc.faults.is_some());
    }

    #[test]
    fn an_rc_plane_beside_the_uc_plane_shares_its_socket() {
        let c = config("streams:\n  logs:\n    reliability: rc\n");
        let ip = "127.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
        let uc = DataPlane::open(&c, ip, 1024, QpType::Uc).unwrap_or_else(|e| panic!("{e}"));
        let rc = uc
            .open_beside(1024, QpType::Rc(RcAttr::default()))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((uc.qp_name(), rc.qp_name()), ("UC QP", "RC QP"));
        let (u, r) = (uc.endpoint(), rc.endpoint());
        assert_eq!(u.udp_addr, r.udp_addr, "one device, one UDP port");
        assert_ne!(u.qpn, r.qpn);
        assert!(rc.fault_stats().is_none(), "the injector is counted once");
        assert_eq!(rc.rc_counters(), RcCounters::default());
        assert_eq!(rc.first_error(), None);
        assert!(rc.idle() && !rc.failed());
        // No RC lane in the Welcome: a clear error naming the RC QP.
        let mut rc = rc;
        let e = rc
            .connect_rc_lane(&Welcome::default())
            .err()
            .unwrap_or_else(|| panic!("connected without an RC lane"));
        assert_eq!(
            e.to_string(),
            "connecting the RC QP to the collector: Welcome has no RC lane"
        );
    }

    #[test]
    fn slot_address_is_conn_seq_mod_slots() {
        let r = RingTarget {
            addr: 0x1000,
            rkey: 7,
            slots: 4,
            slot_bytes: 256,
        };
        assert_eq!(r.slot_addr(0), 0x1000);
        assert_eq!(r.slot_addr(3), 0x1000 + 3 * 256);
        assert_eq!(r.slot_addr(4), 0x1000);
        assert_eq!(r.slot_addr(u64::MAX), 0x1000 + 3 * 256);
    }
}
