//! Opening a verbs device ([`open`], [`VerbsDevice`]): device by name, port by number, RoCE v2
//! GID by type and address; the device's [`DeviceOps`], asynchronous events and counters.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::api::backend::{CompChannelOps, CqOps, DeviceOps, PdOps};
use crate::api::{
    gid_from_ip, ip_from_gid, AllocPdError, AsyncEvent, CompChannelError, CreateCqError, Device,
    DeviceStats, OpenError, PortAttr, QpErrorCause, QpState, TransportKind,
};
use crate::sync::lock;
use crate::wake::WakeFd;

use super::codes::{mtu_from_ibv, GID_TYPE_ROCE_V2, LINK_LAYER_ETHERNET, PORT_ACTIVE};
use super::cq::{VerbsCompChannel, VerbsCq};
use super::ffi::{self, GidEntry, RawAsyncEvent};
use super::pd::VerbsPd;
use super::shared::DevShared;
use super::VerbsConfig;

/// The error text when the host has no RDMA device (or libibverbs finds none).
pub const NO_DEVICE: &str = "no RDMA device found; use transport kind soft";

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

pub(super) fn invalid(detail: String) -> OpenError {
    OpenError::InvalidConfig {
        kind: TransportKind::Verbs,
        detail,
    }
}

pub(super) fn io_err(name: &str, source: io::Error) -> OpenError {
    OpenError::Io {
        kind: TransportKind::Verbs,
        name: name.to_owned(),
        source,
    }
}

/// An opened verbs device ([`DeviceOps`]).
#[derive(Debug)]
pub struct VerbsDevice {
    shared: Arc<DevShared>,
    counters_dir: PathBuf,
}

/// Chooses the GID: an explicit index (which must be RoCE v2), else the RoCE v2 GID of
/// `local_ip`, else the first IPv4-mapped RoCE v2 GID, else the first RoCE v2 GID.
pub(super) fn select_gid(entries: &[GidEntry], config: &VerbsConfig) -> Result<GidEntry, String> {
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
                max_srq: caps.max_srq,
                max_srq_wr: caps.max_srq_wr,
                srqs: Mutex::new(HashMap::new()),
                qps: Mutex::new(HashMap::new()),
            }),
            counters_dir: base,
        })
    }

    /// The GID table index in use.
    pub fn gid_index(&self) -> u32 {
        self.shared.gid.index
    }

    pub(super) fn read_counter(&self, names: &[&str]) -> u64 {
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
            recv_buffer_bytes: None,
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
        let wake = WakeFd::new().map_err(|e| CompChannelError::Device {
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
                RawAsyncEvent::Srq {
                    event_type,
                    srq_handle,
                } => {
                    let srq = lock(&self.shared.srqs)
                        .get(&srq_handle)
                        .and_then(Weak::upgrade);
                    if event_type == ev::SRQ_LIMIT_REACHED {
                        if let Some(q) = &srq {
                            q.limit_events.fetch_add(1, Ordering::Relaxed);
                        }
                        tracing::info!(device = %self.name(), srq = srq_handle, "SRQ below its limit");
                        return Some(AsyncEvent::SrqLimitReached { srq: srq_handle });
                    }
                    if let Some(q) = &srq {
                        q.error_events.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!(device = %self.name(), srq = srq_handle, "SRQ error: its QPs receive nothing more");
                    return Some(AsyncEvent::SrqError { srq: srq_handle });
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
