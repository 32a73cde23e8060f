//! Unit tests of the connections' queue modes ([`QueueMode`]) on a device that refuses a UC
//! QP on its shared receive queue, as ibv_create_qp(3) allows a provider to (an SRQ only on
//! RC and UD QPs): the soft device behind a PD whose `create_qp_with_srq` fails with the
//! errno such a provider returns. Everything else is the real soft device.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use uctel_protocol::control::DataPath;
use uctel_transport::api::backend::{
    CompChannelOps, CqOps, DeviceOps, MrOps, PdOps, QpOps, SrqOps,
};
use uctel_transport::api::{
    AccessFlags, AllocPdError, AsyncEvent, CompChannelError, CreateCqError, CreateQpError,
    CreateSrqError, Device, DeviceStats, PortAttr, QpInitAttr, RegMrError, SharedReceiveQueue,
    TransportKind,
};
use uctel_transport::soft::device::{ProgressMode, SoftConfig, SoftDevice};
use uctel_transport::soft::link::MemoryLink;

use super::{DataPlane, Geometry, QueueMode, Session};
use crate::telemetry::Telemetry;

/// The soft device, whose PDs refuse QPs on an SRQ (counted).
#[derive(Debug)]
struct NoUcOnSrq {
    inner: SoftDevice,
    refused: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct NoUcOnSrqPd {
    inner: Arc<dyn PdOps>,
    refused: Arc<AtomicUsize>,
}

impl PdOps for NoUcOnSrqPd {
    fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Arc<dyn MrOps>, RegMrError> {
        self.inner.reg_mr(len, access)
    }
    fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Arc<dyn QpOps>, CreateQpError> {
        self.inner.create_qp(attr)
    }
    fn create_srq(&self, max_wr: u32) -> Result<Arc<dyn SrqOps>, CreateSrqError> {
        self.inner.create_srq(max_wr)
    }
    fn create_qp_with_srq(
        &self,
        _attr: &QpInitAttr<'_>,
        _srq: &SharedReceiveQueue,
    ) -> Result<Arc<dyn QpOps>, CreateQpError> {
        self.refused.fetch_add(1, Ordering::SeqCst);
        Err(CreateQpError::Device {
            detail: "ibv_create_qp(IBV_QPT_UC, srq 1): Invalid argument (os error 22)".into(),
        })
    }
}

impl DeviceOps for NoUcOnSrq {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn kind(&self) -> TransportKind {
        self.inner.kind()
    }
    fn port_attr(&self) -> PortAttr {
        self.inner.port_attr()
    }
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>, AllocPdError> {
        Ok(Arc::new(NoUcOnSrqPd {
            inner: self.inner.alloc_pd()?,
            refused: Arc::clone(&self.refused),
        }))
    }
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>, CreateCqError> {
        self.inner.create_cq(depth)
    }
    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>, CompChannelError> {
        self.inner.create_comp_channel()
    }
    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.inner.poll_async_event()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
    fn drive(&self) -> usize {
        self.inner.drive()
    }
    fn is_driven(&self) -> bool {
        self.inner.is_driven()
    }
    fn take_changed_qps(&self, out: &mut Vec<u32>) -> bool {
        self.inner.take_changed_qps(out)
    }
}

fn sample(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).map(|v| v.trim().to_owned()))
}

fn modes(tel: &Telemetry) -> [Option<String>; 3] {
    let text = String::from_utf8(tel.render().unwrap_or_else(|e| panic!("{e}")))
        .unwrap_or_else(|e| panic!("{e}"));
    QueueMode::ALL.map(|m| {
        sample(
            &text,
            &format!(
                "uctel_collector_connection_queues{{queues=\"{}\"}}",
                m.as_str()
            ),
        )
    })
}

/// A device that refuses UC QPs on its SRQ: the first Write-with-immediate connection falls
/// back to a receive queue of its own on the shared CQ, gives its SRQ share back, and no later
/// connection asks the device again; the gauge says `shared_cq` for both, and 0 once they are
/// gone. (Before, `Session::create` failed with the device's error and the agent could never
/// connect.)
#[test]
fn a_device_refusing_uc_on_an_srq_falls_back_to_own_receive_queues() {
    let addr = |s: &str| s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}"));
    let (la, _lb) = MemoryLink::pair(addr("10.0.0.1:4791"), addr("10.0.0.2:4791"));
    let config = SoftConfig {
        progress: ProgressMode::BusyPoll,
        ..SoftConfig::default()
    };
    let soft = SoftDevice::with_link(&config, Box::new(la)).unwrap_or_else(|e| panic!("{e}"));
    let refused = Arc::new(AtomicUsize::new(0));
    let device = Device::from_backend(Arc::new(NoUcOnSrq {
        inner: soft,
        refused: Arc::clone(&refused),
    }));
    let tel = Telemetry::new().unwrap_or_else(|e| panic!("{e}"));
    let plane = DataPlane::start(device, 64, tel.clone()).unwrap_or_else(|e| panic!("{e}"));
    let queues = plane
        .shared_queues()
        .unwrap_or_else(|| panic!("the soft device has a shared CQ"));
    assert!(queues.srq.is_some(), "the device creates an SRQ");
    let geometry = Geometry {
        slots: 64,
        slot_bytes: 1024,
        max_frame_bytes: 1024,
        send_buffers: 8,
        credit_window: 32,
    };
    let create = |i: u32| {
        let agent = format!("a{i}");
        Session::create(
            i,
            &agent,
            &plane,
            DataPath::WriteWithImm,
            geometry,
            tel.agent(&agent),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let first = create(1);
    assert_eq!(first.queue_mode(), QueueMode::SharedCq);
    assert!(!first.on_srq());
    assert_eq!(refused.load(Ordering::SeqCst), 1);
    // Its receive WRs went to its own queue: the SRQ is owed nothing.
    assert_eq!(queues.srq_deficit(), 0);
    let second = create(2);
    assert_eq!(second.queue_mode(), QueueMode::SharedCq);
    assert_eq!(
        refused.load(Ordering::SeqCst),
        1,
        "no second try on the SRQ"
    );
    // The telemetry's label list is the modes' names.
    assert_eq!(
        QueueMode::ALL.map(QueueMode::as_str),
        crate::telemetry::CONNECTION_QUEUES
    );
    let count = |n: &str| Some(n.to_owned());
    assert_eq!(modes(&tel), [count("0"), count("2"), count("0")]);
    drop(first);
    drop(second);
    assert_eq!(modes(&tel), [count("0"), count("0"), count("0")]);
    plane.stop();
}
