//! The verbs transport: the [`crate::api`] backend traits implemented on real RDMA devices
//! through libibverbs (`rdma-sys` 0.3.0), behind the `verbs` cargo feature.
//!
//! Layout: `ffi` owns every libibverbs object (one RAII type each, children holding their
//! parents in `Arc`s, all `unsafe` with a `// SAFETY:` note); this file maps the API onto them.
//!
//! What the mapping does (sources: ibv_modify_qp(3), ibv_create_qp(3), ibv_post_send(3),
//! ibv_get_async_event(3), and the Linux rxe driver as verified in the Soft-RoCE VM suite):
//!
//! * Device by name (`VerbsConfig::device`), port by number; RoCE v2 GID chosen by type
//!   (`_ibv_query_gid_ex`, `IBV_GID_TYPE_ROCE_V2`) and by the configured local IP address
//!   (preferring an IPv4-mapped GID when no address is given), or an explicit GID index.
//! * UC QPs with a per-QP receive queue (no SRQ: ibv_create_qp(3) refuses UC with an SRQ), one
//!   SGE per WR. RESET→INIT (`STATE|PKEY_INDEX|PORT|ACCESS_FLAGS`) at creation, INIT→RTR
//!   (`STATE|AV|PATH_MTU|DEST_QPN|RQ_PSN`) and RTR→RTS (`STATE|SQ_PSN`) in `connect`; a GRH
//!   is always present (RoCE).
//! * Unsignaled sends: the send queue slot of an unsignaled WR is only known free once a later
//!   signaled WR completes, so the transport signals one WR on its own at least every half send
//!   queue and hides those completions from the caller. The caller still sees exactly the
//!   completions it asked for (plus every error completion, as ibverbs reports them).
//! * CQs have their own completion channel: [`wait_for_completion`] blocks until a completion
//!   may be ready (`ibv_req_notify_cq` + `ibv_get_cq_event`, events acknowledged in batches).
//!   An API [`CompletionChannel`](crate::api::CompletionChannel) waits on many CQs at once:
//!   `req_notify` arms a CQ and remembers it, `wait` sleeps in `poll(2)` on the channels of the
//!   CQs armed since the last wait plus an eventfd (its `wake`), and takes the events of the
//!   readable ones. Keeping one `ibv_comp_channel` per CQ means every event is taken and
//!   acknowledged on the CQ it belongs to, and destroying a CQ never waits for another CQ's
//!   events.
//! * Asynchronous events are read non-blocking from the context's async fd; QP fatal events
//!   mark the QP's state ERROR.
//! * No device at all (the host kernel has no RDMA, or no device is configured): `open` fails
//!   with [`NO_DEVICE`], never panics.
//!
//! * Teardown order: destroy a QP before the MRs that were written into through it. rxe (Linux
//!   6.1) keeps a reference from a QP that failed in the middle of an inbound RDMA WRITE to the
//!   target MR, and `ibv_dereg_mr` on that MR then blocks for rxe's pool cleanup timeout (about
//!   50 s, found by the VM suite's CQ overflow scenario). MR handles do not keep QPs alive, so
//!   this order is the caller's to keep (drop the `QueuePair` first).
//!
//! Counters: the device does not tell a UC responder's silent drops per QP, so
//! [`QpStats::drops`] stays zero here; [`DeviceStats`] carries the port's packet counters from
//! sysfs (`hw_counters/sent_pkts`/`rcvd_pkts` on rxe, `counters/port_*_packets` elsewhere).

// All unsafe FFI of the workspace lives in this module tree (workspace lint `unsafe_code =
// "deny"`): libibverbs is a C library, and its objects are wrapped once in `ffi` with RAII types
// so that the rest of the transport is safe code.
#![allow(unsafe_code)]

mod ffi;

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use thiserror::Error;

use crate::api::backend::{CompChannelOps, CqOps, DeviceOps, MrOps, PdOps, QpOps};
use crate::api::{
    gid_from_ip, ip_from_gid, AccessFlags, AllocPdError, AsyncEvent, CompChannelError,
    CompletionQueue, ConnectError, CreateCqError, CreateQpError, Device, DeviceStats,
    MemoryAccessError, Mtu, OpenError, PortAttr, PostRecvError, PostRecvErrorKind, PostSendError,
    PostSendErrorKind, QpEndpoint, QpErrorCause, QpInitAttr, QpState, QpStats, RecvWr, RegMrError,
    SendOpcode, SendWr, Sge, TransportKind, VerbsConfig, WcOpcode, WcStatus, WorkCompletion,
    PSN_MASK, ROCE_V2_UDP_PORT,
};

use ffi::{GidEntry, RawAsyncEvent, RawWc, RecvWrRaw, SendWrRaw};

/// The error text when the host has no RDMA device (or libibverbs finds none).
pub const NO_DEVICE: &str = "no RDMA device found; use transport kind soft";

/// `IBV_GID_TYPE_ROCE_V2` (verbs.h `enum ibv_gid_type`).
const GID_TYPE_ROCE_V2: u32 = 2;
/// `IBV_LINK_LAYER_ETHERNET`.
const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_PORT_ACTIVE`.
const PORT_ACTIVE: u32 = 4;
/// GRH hop limit of RoCE v2 packets (the IP TTL rxe and mlx5 put on the wire; perftest uses 64
/// as well).
const HOP_LIMIT: u8 = 64;

/// `enum ibv_wr_opcode` values (verbs.h).
mod wr_opcode {
    pub(super) const RDMA_WRITE: u32 = 0;
    pub(super) const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub(super) const SEND: u32 = 2;
    pub(super) const SEND_WITH_IMM: u32 = 3;
}

/// `enum ibv_wc_opcode` values (verbs.h).
mod wc_opcode {
    pub(super) const SEND: u32 = 0;
    pub(super) const RDMA_WRITE: u32 = 1;
    pub(super) const RECV: u32 = 128;
    pub(super) const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_status` values (verbs.h).
mod wc_status {
    pub(super) const SUCCESS: u32 = 0;
    pub(super) const LOC_LEN_ERR: u32 = 1;
    pub(super) const LOC_QP_OP_ERR: u32 = 2;
    pub(super) const LOC_PROT_ERR: u32 = 4;
    pub(super) const WR_FLUSH_ERR: u32 = 5;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Opening a device
// ---------------------------------------------------------------------------------------------

/// Names of the RDMA devices libibverbs sees (empty on a host without RDMA).
pub fn device_names() -> Vec<String> {
    match ffi::DeviceList::new() {
        (Some(list), _) => (0..list.len()).filter_map(|i| list.name(i)).collect(),
        (None, _) => Vec::new(),
    }
}

/// Opens the RDMA device and port described by `config` and picks its RoCE v2 GID.
///
/// # Errors
/// * [`OpenError::Unsupported`] with [`NO_DEVICE`] when libibverbs lists no device (or fails
///   to list, as on a kernel without RDMA: `ENOSYS`).
/// * [`OpenError::InvalidConfig`] when the named device does not exist (the message lists the
///   devices present), the port does not exist, is not Ethernet (RoCE) or has no usable
///   RoCE v2 GID for `local_ip`.
/// * [`OpenError::Io`] when a verbs call fails.
pub fn open(config: &VerbsConfig) -> Result<Device, OpenError> {
    let dev = VerbsDevice::open(config)?;
    Ok(Device::from_backend(Arc::new(dev)))
}

fn invalid(detail: String) -> OpenError {
    OpenError::InvalidConfig {
        kind: TransportKind::Verbs,
        detail,
    }
}

fn io_err(name: &str, source: io::Error) -> OpenError {
    OpenError::Io {
        kind: TransportKind::Verbs,
        name: name.to_owned(),
        source,
    }
}

/// What every object of a device shares.
struct DevShared {
    ctx: Arc<ffi::Context>,
    port: u8,
    gid: GidEntry,
    /// Active MTU of the port.
    active_mtu: Mtu,
    max_msg_size: u32,
    max_qp_wr: u32,
    max_cqe: u32,
    max_mr_size: u64,
    /// QPs by number, for asynchronous events.
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
}

impl fmt::Debug for DevShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevShared")
            .field("name", &self.ctx.name())
            .field("port", &self.port)
            .field("gid_index", &self.gid.index)
            .field("gid", &ip_from_gid(self.gid.gid))
            .field("active_mtu", &self.active_mtu)
            .finish_non_exhaustive()
    }
}

/// An opened verbs device ([`DeviceOps`]).
#[derive(Debug)]
pub struct VerbsDevice {
    shared: Arc<DevShared>,
    counters_dir: PathBuf,
}

/// The IB MTU of an `enum ibv_mtu` value.
fn mtu_from_ibv(v: u32) -> Option<Mtu> {
    match v {
        1 => Some(Mtu::Mtu256),
        2 => Some(Mtu::Mtu512),
        3 => Some(Mtu::Mtu1024),
        4 => Some(Mtu::Mtu2048),
        5 => Some(Mtu::Mtu4096),
        _ => None,
    }
}

/// The `enum ibv_mtu` value of an IB MTU.
fn mtu_to_ibv(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

/// Chooses the GID: an explicit index (which must be RoCE v2), else the RoCE v2 GID of
/// `local_ip`, else the first IPv4-mapped RoCE v2 GID, else the first RoCE v2 GID.
fn select_gid(entries: &[GidEntry], config: &VerbsConfig) -> Result<GidEntry, String> {
    let v2 = || entries.iter().filter(|e| e.gid_type == GID_TYPE_ROCE_V2);
    let listing = || {
        let v: Vec<String> = entries
            .iter()
            .map(|e| {
                let ty = match e.gid_type {
                    0 => "IB",
                    1 => "RoCE v1",
                    GID_TYPE_ROCE_V2 => "RoCE v2",
                    _ => "?",
                };
                format!("[{}] {} {ty}", e.index, ip_from_gid(e.gid))
            })
            .collect();
        if v.is_empty() {
            "the GID table is empty".to_owned()
        } else {
            format!("GIDs: {}", v.join(", "))
        }
    };
    if let Some(idx) = config.gid_index {
        let e = entries
            .iter()
            .find(|e| e.index == u32::from(idx))
            .ok_or_else(|| format!("GID index {idx} is empty ({})", listing()))?;
        if e.gid_type != GID_TYPE_ROCE_V2 {
            return Err(format!("GID index {idx} is not RoCE v2 ({})", listing()));
        }
        return Ok(*e);
    }
    if let Some(ip) = config.local_ip {
        let want = gid_from_ip(ip);
        return v2()
            .find(|e| e.gid == want)
            .copied()
            .ok_or_else(|| format!("no RoCE v2 GID for local address {ip} ({})", listing()));
    }
    v2().find(|e| matches!(ip_from_gid(e.gid), IpAddr::V4(_)))
        .or_else(|| v2().next())
        .copied()
        .ok_or_else(|| format!("no RoCE v2 GID on the port ({})", listing()))
}

impl VerbsDevice {
    /// See [`open`].
    pub fn open(config: &VerbsConfig) -> Result<Self, OpenError> {
        let (list, list_err) = ffi::DeviceList::new();
        let list = match list {
            Some(l) if l.len() > 0 => l,
            _ => {
                let detail = match list_err {
                    Some(e) => format!("{NO_DEVICE} (ibv_get_device_list: {e})"),
                    None => NO_DEVICE.to_owned(),
                };
                return Err(OpenError::Unsupported {
                    kind: TransportKind::Verbs,
                    detail,
                });
            }
        };
        let names: Vec<String> = (0..list.len())
            .map(|i| list.name(i).unwrap_or_default())
            .collect();
        let index = match &config.device {
            None => 0,
            Some(want) => names.iter().position(|n| n == want).ok_or_else(|| {
                invalid(format!(
                    "RDMA device {want:?} not found; present: {}",
                    names.join(", ")
                ))
            })?,
        };
        let name = names.get(index).cloned().unwrap_or_default();
        let ctx = Arc::new(list.open(index).map_err(|e| io_err(&name, e))?);
        drop(list);

        let caps = ctx.query_device().map_err(|e| io_err(&name, e))?;
        let port = config.port_num;
        if port == 0 || port > caps.phys_port_cnt {
            return Err(invalid(format!(
                "{name} has ports 1..={}, port {port} was asked for",
                caps.phys_port_cnt
            )));
        }
        let pi = ctx.query_port(port).map_err(|e| io_err(&name, e))?;
        if pi.link_layer != LINK_LAYER_ETHERNET {
            return Err(invalid(format!(
                "{name} port {port} is not an Ethernet (RoCE) port; uctel needs RoCE v2"
            )));
        }
        if pi.state != PORT_ACTIVE {
            tracing::warn!(device = %name, port, state = pi.state, "RDMA port is not ACTIVE");
        }
        let active_mtu = mtu_from_ibv(pi.active_mtu).ok_or_else(|| {
            invalid(format!(
                "{name} port {port}: unknown active MTU {}",
                pi.active_mtu
            ))
        })?;
        let entries: Vec<GidEntry> = (0..pi.gid_tbl_len)
            .filter_map(|i| ctx.query_gid_ex(port, i).ok())
            .collect();
        let gid = select_gid(&entries, config)
            .map_err(|d| invalid(format!("{name} port {port}: {d}")))?;
        ctx.set_async_nonblocking().map_err(|e| io_err(&name, e))?;
        tracing::info!(
            device = %name, port, gid_index = gid.index, gid = %ip_from_gid(gid.gid),
            mtu = active_mtu.bytes(), "verbs device opened"
        );
        let base = PathBuf::from("/sys/class/infiniband")
            .join(&name)
            .join("ports")
            .join(port.to_string());
        Ok(Self {
            shared: Arc::new(DevShared {
                ctx,
                port,
                gid,
                active_mtu,
                max_msg_size: pi.max_msg_sz,
                max_qp_wr: caps.max_qp_wr,
                max_cqe: caps.max_cqe,
                max_mr_size: caps.max_mr_size,
                qps: Mutex::new(HashMap::new()),
            }),
            counters_dir: base,
        })
    }

    /// The GID table index in use.
    pub fn gid_index(&self) -> u32 {
        self.shared.gid.index
    }

    fn read_counter(&self, names: &[&str]) -> u64 {
        for n in names {
            if let Ok(s) = std::fs::read_to_string(self.counters_dir.join(n)) {
                if let Ok(v) = s.trim().parse::<u64>() {
                    return v;
                }
            }
        }
        0
    }
}

impl DeviceOps for VerbsDevice {
    fn name(&self) -> &str {
        self.shared.ctx.name()
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Verbs
    }

    fn port_attr(&self) -> PortAttr {
        PortAttr {
            gid: self.shared.gid.gid,
            active_mtu: self.shared.active_mtu.bytes(),
            max_msg_size: self.shared.max_msg_size,
            udp_addr: None,
        }
    }

    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>, AllocPdError> {
        let pd = ffi::Pd::new(&self.shared.ctx).map_err(|e| AllocPdError::Device {
            device: self.shared.ctx.name().to_owned(),
            detail: format!("ibv_alloc_pd: {e}"),
        })?;
        Ok(Arc::new(VerbsPd {
            pd,
            dev: Arc::clone(&self.shared),
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>, CreateCqError> {
        let max = self.shared.max_cqe;
        if depth == 0 || depth > max {
            return Err(CreateCqError::InvalidDepth { depth, max });
        }
        let cq = ffi::Cq::new(&self.shared.ctx, depth).map_err(|e| CreateCqError::Device {
            depth,
            detail: format!("ibv_create_cq: {e}"),
        })?;
        Ok(Arc::new(VerbsCq {
            cq,
            dev: Arc::clone(&self.shared),
            qps: Mutex::new(HashMap::new()),
            stash: Mutex::new(VecDeque::new()),
            stash_len: AtomicUsize::new(0),
        }))
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>, CompChannelError> {
        let wake = crate::soft::wake::WakeFd::new().map_err(|e| CompChannelError::Device {
            what: "eventfd",
            detail: e.to_string(),
        })?;
        Ok(Arc::new(VerbsCompChannel {
            dev: Arc::clone(&self.shared),
            wake,
            armed: Mutex::new(Vec::new()),
            ready: Mutex::new(Vec::new()),
        }))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        use ffi::event_type as ev;
        while let Some(raw) = self.shared.ctx.next_async_event() {
            match raw {
                RawAsyncEvent::CqError { cq_handle } => {
                    tracing::warn!(device = %self.name(), cq = cq_handle, "CQ error (overrun)");
                    return Some(AsyncEvent::CqError { cq: cq_handle });
                }
                RawAsyncEvent::Qp { event_type, qpn }
                    if matches!(
                        event_type,
                        ev::QP_FATAL | ev::QP_REQ_ERR | ev::QP_ACCESS_ERR
                    ) =>
                {
                    let qp = lock(&self.shared.qps).get(&qpn).and_then(Weak::upgrade);
                    if let Some(qp) = &qp {
                        qp.set_state(QpState::Error);
                    }
                    tracing::warn!(device = %self.name(), qpn, event_type, "QP moved to ERROR");
                    return Some(AsyncEvent::QpFatal {
                        qpn,
                        cause: QpErrorCause::Device,
                    });
                }
                RawAsyncEvent::Port { event_type, port } => {
                    let up = event_type == ev::PORT_ACTIVE;
                    if event_type == ev::PORT_ERR || up {
                        tracing::warn!(device = %self.name(), port, up, "RDMA port state changed");
                        return Some(AsyncEvent::PortChange { port, active: up });
                    }
                }
                RawAsyncEvent::DeviceFatal => {
                    tracing::error!(device = %self.name(), "RDMA device fatal error");
                    return Some(AsyncEvent::DeviceFatal);
                }
                other => tracing::debug!(device = %self.name(), ?other, "async event ignored"),
            }
        }
        None
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            packets_received: self
                .read_counter(&["hw_counters/rcvd_pkts", "counters/port_rcv_packets"]),
            packets_sent: self
                .read_counter(&["hw_counters/sent_pkts", "counters/port_xmit_packets"]),
            ..DeviceStats::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Protection domain and memory regions
// ---------------------------------------------------------------------------------------------

/// A protection domain ([`PdOps`]).
#[derive(Debug)]
struct VerbsPd {
    pd: Arc<ffi::Pd>,
    dev: Arc<DevShared>,
}

impl fmt::Debug for ffi::Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.context().name())
            .finish_non_exhaustive()
    }
}

/// `ibv_access_flags` bits of the API's access flags (same values by construction).
fn access_bits(a: AccessFlags) -> u32 {
    a.bits()
}

impl PdOps for VerbsPd {
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError> {
        let max = usize::try_from(self.dev.max_mr_size).unwrap_or(usize::MAX);
        if len == 0 || len > max {
            return Err(RegMrError::InvalidLength { len, max });
        }
        if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(RegMrError::InvalidAccess { access });
        }
        let mr =
            ffi::Mr::new(&self.pd, len, access_bits(access)).map_err(|e| RegMrError::Device {
                len,
                detail: format!("ibv_reg_mr: {e}"),
            })?;
        Ok(Arc::new(VerbsMr { mr, access }))
    }

    fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError> {
        let max = self.dev.max_qp_wr;
        for (queue, depth) in [
            ("send queue", attr.max_send_wr),
            ("receive queue", attr.max_recv_wr),
        ] {
            if depth == 0 || depth > max {
                return Err(CreateQpError::InvalidDepth { queue, depth, max });
            }
        }
        let send_cq =
            verbs_cq(attr.send_cq, &self.dev).ok_or(CreateQpError::ForeignCq { which: "send" })?;
        let recv_cq =
            verbs_cq(attr.recv_cq, &self.dev).ok_or(CreateQpError::ForeignCq { which: "recv" })?;
        let (qp, max_send_wr, max_recv_wr) = ffi::Qp::new(
            &self.pd,
            &send_cq.cq,
            &recv_cq.cq,
            attr.max_send_wr,
            attr.max_recv_wr,
        )
        .map_err(|e| CreateQpError::Device {
            detail: format!("ibv_create_qp(UC): {e}"),
        })?;
        let qpn = qp.qpn();
        qp.modify_to_init(self.dev.port, access_bits(attr.access))
            .map_err(|e| CreateQpError::Device {
                detail: format!(
                    "QP {qpn:#08x}: ibv_modify_qp(INIT, mask {}): {e}",
                    ffi::qp_mask::names(ffi::qp_mask::INIT)
                ),
            })?;
        let mtu = attr
            .max_mtu
            .map_or(self.dev.active_mtu, |m| m.min(self.dev.active_mtu));
        let shared = Arc::new(QpShared {
            qp,
            dev: Arc::clone(&self.dev),
            pd: Arc::clone(&self.pd),
            psn: rand::random::<u32>() & PSN_MASK,
            local_mtu: mtu,
            path_mtu_bytes: AtomicU64::new(u64::from(mtu.bytes())),
            max_send_wr,
            max_recv_wr,
            state: AtomicU8::new(state_code(QpState::Init)),
            send: Mutex::new(SendTrack {
                raw: Vec::with_capacity(ffi::POST_BATCH),
                pending: Vec::with_capacity(ffi::POST_BATCH),
                ..SendTrack::default()
            }),
            recv_scratch: Mutex::new(Vec::with_capacity(ffi::POST_BATCH)),
            stats: QpCounters::default(),
        });
        let weak = Arc::downgrade(&shared);
        lock(&self.dev.qps).insert(qpn, weak.clone());
        for cq in [send_cq, recv_cq] {
            let mut qps = lock(&cq.qps);
            // CQs outlive the QPs of one connection: forget the destroyed ones.
            qps.retain(|_, w| w.strong_count() > 0);
            qps.insert(qpn, weak.clone());
        }
        Ok(Arc::new(VerbsQp { shared }))
    }
}

/// The verbs CQ behind `cq`, if it belongs to this device.
fn verbs_cq<'a>(cq: &'a CompletionQueue, dev: &Arc<DevShared>) -> Option<&'a VerbsCq> {
    let c = cq.backend().as_any().downcast_ref::<VerbsCq>()?;
    Arc::ptr_eq(&c.dev.ctx, &dev.ctx).then_some(c)
}

/// A registered memory region ([`MrOps`]).
struct VerbsMr {
    mr: ffi::Mr,
    access: AccessFlags,
}

impl fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &format_args!("{:#x}", self.mr.addr()))
            .field("len", &self.mr.len())
            .field("lkey", &format_args!("{:#x}", self.mr.lkey()))
            .field("rkey", &format_args!("{:#x}", self.mr.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl MrOps for VerbsMr {
    fn addr(&self) -> u64 {
        self.mr.addr()
    }

    fn length(&self) -> usize {
        self.mr.len()
    }

    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    fn access(&self) -> AccessFlags {
        self.access
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), MemoryAccessError> {
        if self.mr.read(offset, out) {
            Ok(())
        } else {
            Err(MemoryAccessError {
                lkey: self.mr.lkey(),
                offset,
                len: out.len(),
                mr_len: self.mr.len(),
            })
        }
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), MemoryAccessError> {
        if self.mr.write(offset, data) {
            Ok(())
        } else {
            Err(MemoryAccessError {
                lkey: self.mr.lkey(),
                offset,
                len: data.len(),
                mr_len: self.mr.len(),
            })
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Why an SGE cannot be used by a QP of `pd`.
enum SgeProblem {
    Foreign {
        lkey: u32,
    },
    OutOfBounds {
        lkey: u32,
        offset: usize,
        length: u32,
        mr_len: usize,
    },
    NoLocalWrite {
        lkey: u32,
    },
}

/// `(addr, length, lkey)` of an SGE whose MR is a verbs MR of `pd`, inside its bounds.
fn resolve_sge(
    sge: &Sge<'_>,
    pd: &Arc<ffi::Pd>,
    need_local_write: bool,
) -> Result<(u64, u32, u32), SgeProblem> {
    let lkey = sge.mr.lkey();
    let mr = sge
        .mr
        .backend()
        .as_any()
        .downcast_ref::<VerbsMr>()
        .filter(|m| Arc::ptr_eq(m.mr.pd(), pd))
        .ok_or(SgeProblem::Foreign { lkey })?;
    if !sge.in_bounds() {
        return Err(SgeProblem::OutOfBounds {
            lkey,
            offset: sge.offset,
            length: sge.length,
            mr_len: mr.mr.len(),
        });
    }
    if need_local_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(SgeProblem::NoLocalWrite { lkey });
    }
    let addr = mr.mr.addr().saturating_add(sge.offset as u64);
    Ok((addr, sge.length, mr.mr.lkey()))
}

// ---------------------------------------------------------------------------------------------
// Queue pairs
// ---------------------------------------------------------------------------------------------

fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Error => 6,
    }
}

fn state_from_code(c: u32) -> QpState {
    match c {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        // SQD and SQE are not used by UC here; SQE is an error state of the send queue.
        _ => QpState::Error,
    }
}

/// A signaled WR in flight: whether the caller asked for its completion, and how many WRs
/// (itself and the unsignaled ones before it) and packets its completion retires.
#[derive(Clone, Copy, Debug)]
struct SignalMark {
    user_signaled: bool,
    wrs: u64,
    packets: u64,
}

/// Decides whether one more send WR is signaled: when the caller asked, or when `force_every`
/// WRs in a row would otherwise go unsignaled (the send queue only drains through signaled
/// completions). `run`/`run_packets` count the unsignaled WRs (and their packets) since the
/// last signaled one and are reset by a signaled WR, whose mark then retires them all.
fn plan_signal(
    run: &mut u64,
    run_packets: &mut u64,
    user_signaled: bool,
    packets: u64,
    force_every: u64,
) -> Option<SignalMark> {
    *run += 1;
    *run_packets += packets;
    if !user_signaled && *run < force_every {
        return None;
    }
    let mark = SignalMark {
        user_signaled,
        wrs: *run,
        packets: *run_packets,
    };
    *run = 0;
    *run_packets = 0;
    Some(mark)
}

/// Send-queue bookkeeping, guarded by the QP's send mutex (held across `ibv_post_send` so
/// that marks are queued in posting order before any completion can be polled).
#[derive(Debug, Default)]
struct SendTrack {
    marks: VecDeque<SignalMark>,
    /// Unsignaled WRs posted since the last signaled one.
    run: u64,
    /// Packets of those WRs.
    run_packets: u64,
    /// Scratch for one `ibv_post_send` batch: the WRs, and per WR its mark and the run
    /// counters after it (kept to avoid an allocation per post).
    raw: Vec<SendWrRaw>,
    pending: Vec<(Option<SignalMark>, u64, u64)>,
}

#[derive(Debug, Default)]
struct QpCounters {
    packets_sent: AtomicU64,
    messages_sent: AtomicU64,
    messages_completed: AtomicU64,
}

/// State shared by a QP handle and the CQs it uses.
struct QpShared {
    qp: ffi::Qp,
    dev: Arc<DevShared>,
    pd: Arc<ffi::Pd>,
    psn: u32,
    local_mtu: Mtu,
    /// Path MTU in bytes once connected (the local MTU before).
    path_mtu_bytes: AtomicU64,
    max_send_wr: u32,
    max_recv_wr: u32,
    state: AtomicU8,
    send: Mutex<SendTrack>,
    /// Scratch for one `ibv_post_recv` batch.
    recv_scratch: Mutex<Vec<RecvWrRaw>>,
    stats: QpCounters,
}

impl fmt::Debug for QpShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qpn", &format_args!("{:#08x}", self.qp.qpn()))
            .field("state", &self.cached_state())
            .field("psn", &self.psn)
            .field("mtu", &self.local_mtu)
            .finish_non_exhaustive()
    }
}

impl QpShared {
    fn cached_state(&self) -> QpState {
        state_from_code(u32::from(self.state.load(Ordering::Acquire)))
    }

    fn set_state(&self, s: QpState) {
        self.state.store(state_code(s), Ordering::Release);
    }

    /// A WR signals on its own at least this often, so the send queue always drains.
    fn force_signal_every(&self) -> u64 {
        u64::from((self.max_send_wr / 2).max(1))
    }

    /// A successful send completion arrived: retire the oldest mark. Returns whether the caller
    /// asked for this completion.
    fn retire_send(&self) -> bool {
        let mark = lock(&self.send).marks.pop_front();
        match mark {
            Some(m) => {
                self.stats.messages_sent.fetch_add(m.wrs, Ordering::Relaxed);
                self.stats
                    .packets_sent
                    .fetch_add(m.packets, Ordering::Relaxed);
                m.user_signaled
            }
            // Not one of ours (cannot happen while every signaled WR is marked): show it.
            None => true,
        }
    }

    /// An error completion arrived: the QP is in ERROR, every outstanding WR will be flushed
    /// with its own (error) completion, so the marks no longer mean anything.
    fn on_error_completion(&self) {
        self.set_state(QpState::Error);
        let mut t = lock(&self.send);
        t.marks.clear();
        t.run = 0;
        t.run_packets = 0;
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        let qpn = self.qp.qpn();
        let mut qps = lock(&self.dev.qps);
        if qps.get(&qpn).is_some_and(|w| w.strong_count() == 0) {
            qps.remove(&qpn);
        }
    }
}

/// A UC queue pair ([`QpOps`]).
#[derive(Debug)]
struct VerbsQp {
    shared: Arc<QpShared>,
}

impl VerbsQp {
    fn send_error(&self, posted: usize, kind: PostSendErrorKind) -> PostSendError {
        PostSendError {
            qpn: self.shared.qp.qpn(),
            posted,
            kind,
        }
    }

    fn recv_error(&self, posted: usize, kind: PostRecvErrorKind) -> PostRecvError {
        PostRecvError {
            qpn: self.shared.qp.qpn(),
            posted,
            kind,
        }
    }

    /// Maps a provider's refusal of a WR. `ENOMEM` is a full queue (ibv_post_send(3)); other
    /// errors mean the QP is not in a state that accepts WRs.
    fn state_for_errno(&self, e: &io::Error) -> QpState {
        let s = self
            .shared
            .qp
            .query_state()
            .map(state_from_code)
            .unwrap_or(QpState::Error);
        tracing::debug!(qpn = self.shared.qp.qpn(), error = %e, state = %s, "WR refused by the provider");
        s
    }

    /// Checks one send WR and converts it (unsignaled; the caller decides signaling). Returns
    /// the raw WR and the number of packets it makes at `mtu` bytes per packet.
    fn build_send(&self, wr: &SendWr<'_>, mtu: u64) -> Result<(SendWrRaw, u64), PostSendErrorKind> {
        let s = &self.shared;
        let sge = match &wr.sge {
            None => None,
            Some(sge) => Some(resolve_sge(sge, &s.pd, false).map_err(|p| match p {
                SgeProblem::Foreign { lkey } | SgeProblem::NoLocalWrite { lkey } => {
                    PostSendErrorKind::ForeignMr { lkey }
                }
                SgeProblem::OutOfBounds {
                    lkey,
                    offset,
                    length,
                    mr_len,
                } => PostSendErrorKind::SgeOutOfBounds {
                    lkey,
                    offset,
                    length,
                    mr_len,
                },
            })?),
        };
        let length = wr.length();
        if length > s.dev.max_msg_size {
            return Err(PostSendErrorKind::MessageTooLong {
                length,
                max: s.dev.max_msg_size,
            });
        }
        let (opcode, imm, remote_addr, rkey) = match wr.opcode {
            SendOpcode::Send => (wr_opcode::SEND, 0, 0, 0),
            SendOpcode::SendWithImm { imm } => (wr_opcode::SEND_WITH_IMM, imm, 0, 0),
            SendOpcode::RdmaWrite { remote_addr, rkey } => {
                (wr_opcode::RDMA_WRITE, 0, remote_addr, rkey)
            }
            SendOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (wr_opcode::RDMA_WRITE_WITH_IMM, imm, remote_addr, rkey),
        };
        let packets = u64::from(length).div_ceil(mtu).max(1);
        let raw = SendWrRaw {
            wr_id: wr.wr_id,
            opcode,
            sge,
            signaled: false,
            imm,
            remote_addr,
            rkey,
        };
        Ok((raw, packets))
    }

    fn connect_inner(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        let s = &self.shared;
        let qpn = s.qp.qpn();
        let state = s.cached_state();
        if state != QpState::Init {
            return Err(ConnectError::InvalidState { qpn, state });
        }
        let bad = |detail: String| ConnectError::InvalidEndpoint { qpn, detail };
        let remote_mtu = Mtu::from_bytes(remote.mtu)
            .ok_or_else(|| bad(format!("MTU {} is not an IB MTU", remote.mtu)))?;
        if remote.qpn > PSN_MASK || remote.qpn == 0 {
            return Err(bad(format!(
                "QPN {:#x} is not a 24-bit UC QP number",
                remote.qpn
            )));
        }
        if remote.psn > PSN_MASK {
            return Err(bad(format!("PSN {:#x} exceeds 24 bits", remote.psn)));
        }
        if let Some(addr) = remote.udp_addr {
            let gid_ip = ip_from_gid(remote.gid);
            if addr.port() != ROCE_V2_UDP_PORT || addr.ip() != gid_ip {
                return Err(bad(format!(
                    "UDP address {addr}: an RDMA device sends RoCEv2 only to port {ROCE_V2_UDP_PORT} of \
                     the GID's address {gid_ip}"
                )));
            }
        }
        let path_mtu = remote_mtu.min(s.local_mtu);
        let rtr = ffi::RtrAttr {
            port: s.dev.port,
            dgid: remote.gid,
            sgid_index: u8::try_from(s.dev.gid.index).unwrap_or(u8::MAX),
            hop_limit: HOP_LIMIT,
            path_mtu: mtu_to_ibv(path_mtu),
            dest_qpn: remote.qpn,
            rq_psn: remote.psn,
        };
        s.qp.modify_to_rtr(&rtr).map_err(|e| ConnectError::Modify {
            qpn,
            target: QpState::Rtr,
            detail: format!(
                "ibv_modify_qp(mask {}; dgid {}, sgid_index {}, path_mtu {}, dest_qp_num {:#x}, \
                 rq_psn {:#x}): {e}",
                ffi::qp_mask::names(ffi::qp_mask::RTR),
                ip_from_gid(remote.gid),
                s.dev.gid.index,
                path_mtu.bytes(),
                remote.qpn,
                remote.psn
            ),
        })?;
        s.set_state(QpState::Rtr);
        s.qp.modify_to_rts(s.psn)
            .map_err(|e| ConnectError::Modify {
                qpn,
                target: QpState::Rts,
                detail: format!(
                    "ibv_modify_qp(mask {}; sq_psn {:#x}): {e} (the QP stays in RTR)",
                    ffi::qp_mask::names(ffi::qp_mask::RTS),
                    s.psn
                ),
            })?;
        s.path_mtu_bytes
            .store(u64::from(path_mtu.bytes()), Ordering::Release);
        s.set_state(QpState::Rts);
        Ok(())
    }
}

impl QpOps for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.shared.qp.qpn()
    }

    fn state(&self) -> QpState {
        // The device may have moved the QP to ERROR on its own (CQ overrun, bad receive WR).
        match self.shared.qp.query_state() {
            Ok(code) => {
                let s = state_from_code(code);
                self.shared.set_state(s);
                s
            }
            Err(_) => self.shared.cached_state(),
        }
    }

    fn local_endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            gid: self.shared.dev.gid.gid,
            qpn: self.shared.qp.qpn(),
            psn: self.shared.psn,
            mtu: self.shared.local_mtu.bytes(),
            udp_addr: None,
        }
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<(), ConnectError> {
        self.connect_inner(remote)
    }

    fn modify_to_error(&self) {
        if let Err(e) = self.shared.qp.modify_to_error() {
            tracing::warn!(qpn = self.shared.qp.qpn(), error = %e, "ibv_modify_qp(ERR) failed");
        }
        self.shared.set_state(QpState::Error);
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostSendError> {
        let s = &self.shared;
        let state = s.cached_state();
        if state != QpState::Rts {
            return Err(self.send_error(0, PostSendErrorKind::InvalidState { state }));
        }
        let mtu = s.path_mtu_bytes.load(Ordering::Acquire).max(1);
        let force_every = s.force_signal_every();
        let mut guard = lock(&s.send);
        let track = &mut *guard;
        let mut done = 0usize;
        for chunk in wrs.chunks(ffi::POST_BATCH) {
            track.raw.clear();
            track.pending.clear();
            let (mut run, mut run_packets) = (track.run, track.run_packets);
            let mut invalid = None;
            for wr in chunk {
                match self.build_send(wr, mtu) {
                    Ok((raw, packets)) => {
                        let mark = plan_signal(
                            &mut run,
                            &mut run_packets,
                            wr.signaled,
                            packets,
                            force_every,
                        );
                        track.raw.push(SendWrRaw {
                            signaled: mark.is_some(),
                            ..raw
                        });
                        track.pending.push((mark, run, run_packets));
                    }
                    Err(kind) => {
                        invalid = Some(kind);
                        break;
                    }
                }
            }
            // Post what was valid (ibverbs bad_wr semantics: WRs before the bad one go out).
            let result = s.qp.post_send(&track.raw);
            let posted = match &result {
                Ok(()) => track.raw.len(),
                Err((p, _)) => *p,
            };
            for (mark, _, _) in track.pending.iter().take(posted) {
                if let Some(m) = mark {
                    track.marks.push_back(*m);
                }
            }
            if let Some((_, r, p)) = posted.checked_sub(1).and_then(|i| track.pending.get(i)) {
                (track.run, track.run_packets) = (*r, *p);
            }
            let at = done + posted;
            if let Err((_, e)) = result {
                return Err(if e.raw_os_error() == Some(libc::ENOMEM) {
                    self.send_error(
                        at,
                        PostSendErrorKind::Full {
                            depth: s.max_send_wr,
                        },
                    )
                } else {
                    let state = self.state_for_errno(&e);
                    self.send_error(at, PostSendErrorKind::InvalidState { state })
                });
            }
            if let Some(kind) = invalid {
                return Err(self.send_error(at, kind));
            }
            done = at;
        }
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        let s = &self.shared;
        let mut raw = lock(&s.recv_scratch);
        let mut done = 0usize;
        for chunk in wrs.chunks(ffi::POST_BATCH) {
            raw.clear();
            let mut invalid = None;
            for wr in chunk {
                let sge = match &wr.sge {
                    None => None,
                    Some(sge) => match resolve_sge(sge, &s.pd, true) {
                        Ok(t) => Some(t),
                        Err(p) => {
                            invalid = Some(match p {
                                SgeProblem::Foreign { lkey } => {
                                    PostRecvErrorKind::ForeignMr { lkey }
                                }
                                SgeProblem::NoLocalWrite { lkey } => {
                                    PostRecvErrorKind::NoLocalWrite { lkey }
                                }
                                SgeProblem::OutOfBounds {
                                    lkey,
                                    offset,
                                    length,
                                    mr_len,
                                } => PostRecvErrorKind::SgeOutOfBounds {
                                    lkey,
                                    offset,
                                    length,
                                    mr_len,
                                },
                            });
                            break;
                        }
                    },
                };
                raw.push(RecvWrRaw {
                    wr_id: wr.wr_id,
                    sge,
                });
            }
            let result = s.qp.post_recv(&raw);
            let posted = match &result {
                Ok(()) => raw.len(),
                Err((p, _)) => *p,
            };
            let at = done + posted;
            if let Err((_, e)) = result {
                return Err(if e.raw_os_error() == Some(libc::ENOMEM) {
                    self.recv_error(
                        at,
                        PostRecvErrorKind::Full {
                            depth: s.max_recv_wr,
                        },
                    )
                } else {
                    let state = self.state_for_errno(&e);
                    self.recv_error(at, PostRecvErrorKind::InvalidState { state })
                });
            }
            if let Some(kind) = invalid {
                return Err(self.recv_error(at, kind));
            }
            done = at;
        }
        Ok(())
    }

    fn stats(&self) -> QpStats {
        let c = &self.shared.stats;
        let sent = c.messages_sent.load(Ordering::Relaxed);
        let completed = c.messages_completed.load(Ordering::Relaxed);
        QpStats {
            packets_sent: c.packets_sent.load(Ordering::Relaxed),
            messages_sent: sent,
            messages_completed: completed,
            ..QpStats::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Completion queues
// ---------------------------------------------------------------------------------------------

/// A completion queue with its own completion channel ([`CqOps`]).
struct VerbsCq {
    cq: Arc<ffi::Cq>,
    dev: Arc<DevShared>,
    /// QPs whose send or receive completions land here, by number.
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
    /// Completions read while arming for a blocking wait, handed out by the next `poll`.
    stash: Mutex<VecDeque<WorkCompletion>>,
    stash_len: AtomicUsize,
}

impl fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsCq")
            .field("handle", &self.cq.handle())
            .field("depth", &self.cq.depth())
            .finish_non_exhaustive()
    }
}

fn wc_status(v: u32) -> WcStatus {
    match v {
        wc_status::SUCCESS => WcStatus::Success,
        wc_status::LOC_LEN_ERR => WcStatus::LocalLengthError,
        wc_status::LOC_QP_OP_ERR => WcStatus::LocalQpOperationError,
        wc_status::LOC_PROT_ERR => WcStatus::LocalProtectionError,
        wc_status::WR_FLUSH_ERR => WcStatus::WrFlushError,
        _ => WcStatus::GeneralError,
    }
}

fn wc_opcode(v: u32) -> WcOpcode {
    match v {
        wc_opcode::SEND => WcOpcode::Send,
        wc_opcode::RDMA_WRITE => WcOpcode::RdmaWrite,
        wc_opcode::RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        wc_opcode::RECV => WcOpcode::Recv,
        // Nothing else is produced by a UC QP; error completions leave the opcode undefined
        // (ibv_poll_cq(3)), where only wr_id, status and qp_num count.
        _ => WcOpcode::Recv,
    }
}

impl VerbsCq {
    /// Reads up to `out.len()` completions from the device, hides the ones the transport
    /// signaled on its own, and converts the rest. Returns how many were written.
    fn poll_device(&self, out: &mut [WorkCompletion]) -> usize {
        let mut written = 0usize;
        let mut raw = [RawWc::default(); ffi::POLL_BATCH];
        while written < out.len() {
            let want = (out.len() - written).min(ffi::POLL_BATCH);
            let n = match self.cq.poll(&mut raw[..want]) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(cq = self.cq.handle(), error = %e, "ibv_poll_cq failed");
                    0
                }
            };
            if n == 0 {
                break;
            }
            let qps = lock(&self.qps);
            for wc in raw.iter().take(n) {
                let qp = qps.get(&wc.qp_num).and_then(Weak::upgrade);
                let success = wc.status == wc_status::SUCCESS;
                let show = match (&qp, success, wc.opcode) {
                    (Some(qp), true, wc_opcode::SEND | wc_opcode::RDMA_WRITE) => qp.retire_send(),
                    (Some(qp), true, _) => {
                        qp.stats.messages_completed.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    (Some(qp), false, _) => {
                        qp.on_error_completion();
                        true
                    }
                    (None, _, _) => true,
                };
                if !show {
                    continue;
                }
                if let Some(slot) = out.get_mut(written) {
                    *slot = WorkCompletion {
                        wr_id: wc.wr_id,
                        status: wc_status(wc.status),
                        opcode: wc_opcode(wc.opcode),
                        byte_len: wc.byte_len,
                        imm: wc.imm,
                        qp_num: wc.qp_num,
                    };
                    written += 1;
                }
            }
            if n < want {
                break;
            }
        }
        written
    }

    /// Arms the CQ, re-checks it (a completion that arrived before arming raises no event),
    /// then waits for a completion event.
    fn wait(&self, timeout: Duration) -> io::Result<bool> {
        if self.stash_len.load(Ordering::Acquire) > 0 {
            return Ok(true);
        }
        self.cq.arm()?;
        let mut buf = [WorkCompletion::default(); ffi::POLL_BATCH];
        let n = self.poll_device(&mut buf);
        if n > 0 {
            let mut stash = lock(&self.stash);
            stash.extend(buf.iter().take(n).copied());
            self.stash_len.store(stash.len(), Ordering::Release);
            return Ok(true);
        }
        self.cq.wait_event(timeout)
    }
}

impl CqOps for VerbsCq {
    fn depth(&self) -> u32 {
        self.cq.depth()
    }

    fn handle(&self) -> u32 {
        self.cq.handle()
    }

    fn poll(&self, wcs: &mut [WorkCompletion]) -> usize {
        let mut n = 0usize;
        if self.stash_len.load(Ordering::Acquire) > 0 {
            let mut stash = lock(&self.stash);
            while n < wcs.len() {
                let Some(wc) = stash.pop_front() else { break };
                if let Some(slot) = wcs.get_mut(n) {
                    *slot = wc;
                }
                n += 1;
            }
            self.stash_len.store(stash.len(), Ordering::Release);
        }
        match wcs.get_mut(n..) {
            Some(rest) if !rest.is_empty() => n + self.poll_device(rest),
            _ => n,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A completion channel over the per-CQ channels of the CQs it armed (see the module docs).
struct VerbsCompChannel {
    dev: Arc<DevShared>,
    /// `wake()` makes it readable.
    wake: crate::soft::wake::WakeFd,
    /// CQs armed since the last `wait` (kept alive until then).
    armed: Mutex<Vec<Arc<ffi::Cq>>>,
    /// `poll_readable` output, kept to reuse its allocation.
    ready: Mutex<Vec<bool>>,
}

impl fmt::Debug for VerbsCompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsCompChannel")
            .field("armed", &lock(&self.armed).len())
            .finish_non_exhaustive()
    }
}

impl CompChannelOps for VerbsCompChannel {
    fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError> {
        let v = verbs_cq(cq, &self.dev).ok_or(CompChannelError::ForeignCq {
            handle: cq.handle(),
        })?;
        v.cq.arm().map_err(|e| CompChannelError::Device {
            what: "ibv_req_notify_cq",
            detail: e.to_string(),
        })?;
        let mut armed = lock(&self.armed);
        if !armed.iter().any(|c| Arc::ptr_eq(c, &v.cq)) {
            armed.push(Arc::clone(&v.cq));
        }
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError> {
        if self.wake.take() {
            return Ok(true);
        }
        let cqs = std::mem::take(&mut *lock(&self.armed));
        let fds: Vec<std::os::raw::c_int> =
            std::iter::once(std::os::fd::AsRawFd::as_raw_fd(&self.wake.borrow()))
                .chain(cqs.iter().map(|c| c.channel_fd()))
                .collect();
        let mut ready = lock(&self.ready);
        ffi::poll_readable(&fds, timeout, &mut ready).map_err(|e| CompChannelError::Device {
            what: "poll",
            detail: e.to_string(),
        })?;
        let mut woken = false;
        if ready.first().copied().unwrap_or(false) {
            let _ = self.wake.clear();
            woken = true;
        }
        for (cq, r) in cqs.iter().zip(ready.iter().skip(1)) {
            if *r {
                woken = true;
                if let Err(e) = cq.take_event() {
                    return Err(CompChannelError::Device {
                        what: "ibv_get_cq_event",
                        detail: e.to_string(),
                    });
                }
            }
        }
        Ok(woken)
    }

    fn wake(&self) {
        self.wake.wake();
    }
}

/// [`wait_for_completion`] failed.
#[derive(Debug, Error)]
pub enum WaitError {
    /// The CQ is not a verbs CQ (the soft transport has its own progress modes).
    #[error("CQ {handle} is not a verbs completion queue")]
    NotVerbs {
        /// The CQ's handle.
        handle: u32,
    },
    /// Arming the CQ or reading its completion channel failed.
    #[error("waiting on CQ {handle}: {source}")]
    Io {
        /// The CQ's handle.
        handle: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Blocks until `cq` may hold a completion or `timeout` passes, without spinning: arms the CQ
/// (`ibv_req_notify_cq`), re-polls it, then sleeps on its completion channel
/// (`ibv_get_cq_event`). Returns `Ok(true)` when completions may be ready (poll the CQ until
/// it is empty before waiting again), `Ok(false)` on timeout.
///
/// # Errors
/// [`WaitError::NotVerbs`] for a CQ of another transport; [`WaitError::Io`] when a verbs call
/// fails.
pub fn wait_for_completion(cq: &CompletionQueue, timeout: Duration) -> Result<bool, WaitError> {
    let handle = cq.handle();
    let v = cq
        .backend()
        .as_any()
        .downcast_ref::<VerbsCq>()
        .ok_or(WaitError::NotVerbs { handle })?;
    v.wait(timeout)
        .map_err(|source| WaitError::Io { handle, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, ip: &str, gid_type: u32) -> GidEntry {
        let ip: IpAddr = ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        GidEntry {
            gid: gid_from_ip(ip),
            index,
            gid_type,
            ndev_ifindex: 3,
        }
    }

    /// rxe's table on a veth with an IPv6 link-local and an IPv4 address.
    fn rxe_table() -> Vec<GidEntry> {
        vec![
            entry(0, "fe80::1", 1),
            entry(1, "fe80::1", GID_TYPE_ROCE_V2),
            entry(2, "10.77.0.1", 1),
            entry(3, "10.77.0.1", GID_TYPE_ROCE_V2),
        ]
    }

    #[test]
    fn gid_selection_prefers_ipv4_roce_v2() {
        let t = rxe_table();
        let g = select_gid(&t, &VerbsConfig::default());
        assert_eq!(g.map(|e| e.index), Ok(3));
    }

    #[test]
    fn gid_selection_by_local_ip_and_by_index() {
        let t = rxe_table();
        let by_ip = VerbsConfig {
            local_ip: "fe80::1".parse().ok(),
            ..VerbsConfig::default()
        };
        assert_eq!(select_gid(&t, &by_ip).map(|e| e.index), Ok(1));
        let missing = VerbsConfig {
            local_ip: "10.9.9.9".parse().ok(),
            ..VerbsConfig::default()
        };
        let err = select_gid(&t, &missing).err().unwrap_or_default();
        assert!(
            err.contains("no RoCE v2 GID for local address 10.9.9.9"),
            "{err}"
        );
        assert!(err.contains("[3] 10.77.0.1 RoCE v2"), "{err}");
        let v1 = VerbsConfig {
            gid_index: Some(2),
            ..VerbsConfig::default()
        };
        assert!(select_gid(&t, &v1).is_err());
        let v2 = VerbsConfig {
            gid_index: Some(1),
            ..VerbsConfig::default()
        };
        assert_eq!(select_gid(&t, &v2).map(|e| e.index), Ok(1));
        assert!(select_gid(&[], &VerbsConfig::default()).is_err());
    }

    #[test]
    fn unsignaled_runs_are_cut_by_a_hidden_signaled_wr() {
        let (mut run, mut pk) = (0u64, 0u64);
        let mut marks = Vec::new();
        // 10 unsignaled one-packet WRs with a forced signal every 4.
        for _ in 0..10 {
            marks.push(plan_signal(&mut run, &mut pk, false, 1, 4));
        }
        let forced: Vec<usize> = marks
            .iter()
            .enumerate()
            .filter(|(_, m)| m.is_some())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(forced, vec![3, 7]);
        for m in marks.iter().flatten() {
            assert!(!m.user_signaled);
            assert_eq!((m.wrs, m.packets), (4, 4));
        }
        assert_eq!((run, pk), (2, 2));
        // A caller-signaled 3-packet WR retires the two pending ones and itself.
        let m = plan_signal(&mut run, &mut pk, true, 3, 4);
        assert_eq!(
            m.map(|m| (m.user_signaled, m.wrs, m.packets)),
            Some((true, 3, 5))
        );
        assert_eq!((run, pk), (0, 0));
        // Every WR is accounted for exactly once: 2 forced marks of 4 plus 3.
        let total: u64 = marks.iter().flatten().map(|m| m.wrs).sum::<u64>() + 3;
        assert_eq!(total, 11);
    }

    #[test]
    fn mtu_codes_round_trip() {
        for m in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(mtu_from_ibv(mtu_to_ibv(m)), Some(m));
        }
        assert_eq!(mtu_from_ibv(0), None);
        assert_eq!(mtu_from_ibv(6), None);
    }

    #[test]
    fn completion_codes_map_to_the_api() {
        assert_eq!(wc_status(0), WcStatus::Success);
        assert_eq!(wc_status(5), WcStatus::WrFlushError);
        assert_eq!(wc_status(12), WcStatus::GeneralError);
        assert_eq!(wc_opcode(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc_opcode(128), WcOpcode::Recv);
        assert_eq!(wc_opcode(1), WcOpcode::RdmaWrite);
    }

    /// On a host without RDMA (this project's build machines: the kernel has no RDMA at all)
    /// opening fails with the documented message and never panics; on a host with devices it
    /// opens the first one.
    #[test]
    fn open_without_device_is_a_clear_error() {
        let has_devices = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| d.count() > 0)
            .unwrap_or(false);
        match open(&VerbsConfig::default()) {
            Ok(dev) => assert!(has_devices, "opened {} on a host without RDMA", dev.name()),
            Err(e) => {
                let msg = e.to_string();
                if has_devices {
                    panic!("devices present but open failed: {msg}");
                }
                assert!(msg.contains(NO_DEVICE), "{msg}");
                assert!(matches!(
                    e,
                    OpenError::Unsupported {
                        kind: TransportKind::Verbs,
                        ..
                    }
                ));
            }
        }
        let named = VerbsConfig {
            device: Some("nonexistent0".to_owned()),
            ..VerbsConfig::default()
        };
        let e = open(&named)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains(NO_DEVICE) || e.contains("\"nonexistent0\" not found"),
            "{e}"
        );
    }
}
