//! The agent's data plane on one connection: a UC QP on the configured transport, a
//! registered send buffer pool, and the two ways a frame reaches the collector
//! (DESIGN.md §4):
//!
//! - `write_with_imm`: RDMA WRITE_WITH_IMM of the frame with connection sequence `c` to
//!   `ring_addr + (c mod slots) × slot_bytes` under the ring's rkey; the immediate is the low
//!   32 bits of `c` ([`conn_seq_immediate`]);
//! - `send`: a SEND of the frame into a receive buffer the collector posted.
//!
//! A send buffer is reused only after its send completion was polled (the transport may read
//! it until then). No free buffer, or a full send queue, is a cheap [`PostOutcome::Busy`]; the
//! pipeline keeps the frame and tries again (UC never retransmits, but not having posted yet
//! is not a retransmission).

use std::net::{IpAddr, SocketAddr};

use std::sync::Arc;
use uctel_protocol::control::{self, Welcome};
use uctel_protocol::frame::conn_seq_immediate;
use uctel_transport::api::{
    self, AccessFlags, CompletionQueue, Device, MemoryRegion, QpInitAttr, QpState, QpType,
    QueuePair, SendWr, Sge, WcStatus, WorkCompletion,
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
    #[error("connecting the UC QP to the collector: {0}")]
    Connect(String),
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
    send_cq: CompletionQueue,
    // Kept alive with the QP: the agent receives nothing, but the QP needs a receive CQ.
    _recv_cq: CompletionQueue,
    mr: MemoryRegion,
    buf_bytes: usize,
    free: Vec<usize>,
    ring: Option<RingTarget>,
    wcs: Vec<WorkCompletion>,
    completion_errors: u64,
    fault_stats: Option<Arc<FaultStats>>,
}

/// Maps the agent's transport settings to a device configuration. `local_ip` is the local
/// address of the control connection; the soft device binds an ephemeral port on it unless
/// `transport.soft.bind` says otherwise.
pub fn device_config(config: &AgentConfig, local_ip: IpAddr) -> DeviceConfig {
    match config.transport.kind {
        TransportKind::Soft => {
            let soft = &config.transport.soft;
            DeviceConfig::Soft(SoftConfig {
                name: "uctel-agent".to_owned(),
                udp: UdpConfig {
                    bind: soft.bind.unwrap_or_else(|| SocketAddr::new(local_ip, 0)),
                    // The agent sends; a small receive buffer is plenty, and no 64 KiB
                    // UDP_GRO receive slots. Sends use UDP_SEGMENT (the default).
                    recv_buffer_bytes: Some(256 << 10),
                    gro: false,
                    ..UdpConfig::default()
                },
                mtu_bytes: soft.mtu_bytes,
                // No progress thread: the agent only sends, `post_send` transmits at once,
                // and the sender's completion polling (`reap`) drives the device. Saves a
                // thread waking every `progress_wait_micros` on every host.
                progress: ProgressMode::BusyPoll,
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
    /// Opens the device and creates the QP (in INIT), its CQs and a pool of
    /// [`SEND_QUEUE_DEPTH`] send buffers of `max_frame_bytes` each.
    ///
    /// # Errors
    /// [`DataPlaneError`] naming the object that could not be created.
    pub fn open(
        config: &AgentConfig,
        local_ip: IpAddr,
        max_frame_bytes: usize,
    ) -> Result<DataPlane, DataPlaneError> {
        let (device, fault_stats) = open_device(config, local_ip)?;
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
                qp_type: QpType::Uc,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                max_send_wr: SEND_QUEUE_DEPTH,
                max_recv_wr: 1,
                access: AccessFlags::NONE,
                max_mtu: None,
            })
            .map_err(|e| resource("UC QP")(e.to_string()))?;
        let buf_bytes = max_frame_bytes.max(1);
        let mr = pd
            .reg_mr(
                buf_bytes * SEND_QUEUE_DEPTH as usize,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(|e| resource("send buffer MR")(e.to_string()))?;
        Ok(DataPlane {
            device,
            qp,
            send_cq,
            _recv_cq: recv_cq,
            mr,
            buf_bytes,
            free: (0..SEND_QUEUE_DEPTH as usize).rev().collect(),
            ring: None,
            wcs: vec![WorkCompletion::default(); 64],
            completion_errors: 0,
            fault_stats,
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

    /// Connects the QP (INIT → RTR → RTS) to the collector's endpoint from `welcome` and
    /// remembers its ring.
    ///
    /// # Errors
    /// [`DataPlaneError::Connect`] for an unusable endpoint or a refused transition.
    pub fn connect(&mut self, welcome: &Welcome) -> Result<(), DataPlaneError> {
        let qp = welcome
            .qp
            .as_ref()
            .ok_or_else(|| DataPlaneError::Connect("Welcome has no QP endpoint".into()))?;
        let gid = qp
            .gid_array()
            .ok_or_else(|| DataPlaneError::Connect("GID is not 16 bytes".into()))?;
        let remote = api::QpEndpoint {
            gid,
            qpn: qp.qpn,
            psn: qp.psn,
            mtu: qp.mtu,
            udp_addr: qp.udp_socket_addr(),
        };
        self.qp
            .connect(&remote)
            .map_err(|e| DataPlaneError::Connect(e.to_string()))?;
        self.ring = Some(RingTarget::from_welcome(welcome));
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
                if wc.status != WcStatus::Success {
                    errors += 1;
                }
            }
            if n < self.wcs.len() {
                break;
            }
        }
        self.completion_errors += errors;
        errors
    }

    /// Whether the QP fell into ERROR (e.g. a failed send completion): the connection must
    /// be rebuilt (DESIGN.md §2).
    pub fn failed(&self) -> bool {
        self.qp.state() == QpState::Error
    }

    /// Takes the device's pending async events (non-blocking), counts and logs them in
    /// `metrics`; returns the kind of the first one that ends the session
    /// ([`crate::rdma_events::drain_async_events`]).
    pub fn poll_async_events(&self, metrics: &RdmaEventMetrics) -> Option<AsyncEventKind> {
        drain_async_events(&self.device, metrics)
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
