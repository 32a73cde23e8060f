//! [`Device`]: an opened transport device (`struct ibv_context` + port) and the backend trait
//! [`DeviceOps`] a transport implements for it. Opening one from configuration is
//! [`crate::device`]'s job (`Device::open`), the only module that knows both transports.

use std::fmt;
use std::sync::Arc;

use super::cq::{CompChannelOps, CompletionChannel, CompletionQueue, CqOps};
use super::error::{AllocPdError, CompChannelError, CreateCqError};
use super::event::AsyncEvent;
use super::pd::{PdOps, ProtectionDomain};
use super::stats::DeviceStats;
use super::types::{PortAttr, TransportKind};

/// An opened transport device (`struct ibv_context` + port). Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Device {
    inner: Arc<dyn DeviceOps>,
}

impl Device {
    /// Wraps a transport's device implementation.
    pub fn from_backend(inner: Arc<dyn DeviceOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn DeviceOps> {
        &self.inner
    }

    /// Device name (`rxe0`, `mlx5_0`, or the soft device's configured name).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Which transport this is.
    pub fn kind(&self) -> TransportKind {
        self.inner.kind()
    }

    /// Port attributes: GID, active MTU, maximum message size, UDP address.
    pub fn port_attr(&self) -> PortAttr {
        self.inner.port_attr()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// [`AllocPdError`] when the device refuses.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, AllocPdError> {
        Ok(ProtectionDomain::from_backend(self.inner.alloc_pd()?))
    }

    /// Creates a completion queue holding up to `depth` completions (`ibv_create_cq`).
    ///
    /// A full CQ does not block the transport: the completion that does not fit is lost and the
    /// QP that produced it moves to ERROR ([`AsyncEvent::CqError`] + [`AsyncEvent::QpFatal`]).
    ///
    /// # Errors
    /// [`CreateCqError::InvalidDepth`] for 0 or above the device maximum.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue, CreateCqError> {
        Ok(CompletionQueue::from_backend(self.inner.create_cq(depth)?))
    }

    /// Creates a completion channel (`ibv_create_comp_channel`): a thread blocks on it until
    /// one of the CQs it armed with [`CompletionChannel::req_notify`] receives a completion,
    /// so a poller sleeps while there is nothing to do instead of spinning.
    ///
    /// # Errors
    /// [`CompChannelError::Device`] when the OS refuses (out of file descriptors).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel, CompChannelError> {
        Ok(CompletionChannel::from_backend(
            self.inner.create_comp_channel()?,
        ))
    }

    /// Takes the oldest pending asynchronous event, if any (non-blocking).
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.inner.poll_async_event()
    }

    /// Device-wide counters (drops before a QP is known, packets in and out).
    pub fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }

    /// Runs one progress round of a soft device in `driven` mode without blocking (send
    /// what is queued, receive one batch, process it: ring writes, CQ pushes, flushes of QPs
    /// in ERROR); returns the packets received plus sent. `0` and nothing done on every
    /// other device: verbs hardware and thread-mode soft devices progress by themselves,
    /// busy-poll soft devices in `poll_cq`.
    pub fn drive(&self) -> usize {
        self.inner.drive()
    }

    /// Whether this device moves packets only in [`Device::drive`] (a soft device in
    /// `driven` mode). Such a device's empty poll costs a receive system call, so its
    /// poller should sleep on the completion channel (which wakes on the device's socket)
    /// rather than spin.
    pub fn is_driven(&self) -> bool {
        self.inner.is_driven()
    }

    /// For a device about to stop: sends at once every packet it still holds (its send
    /// queue, and what a soft device's fault injector holds back to reorder or delay); what
    /// the network will not take now is counted as the injector's drops
    /// ([`crate::soft::link::Link::flush_held`]). Call it after the last send completed and
    /// before reading the injector's figures, so they add up. Nothing on other devices.
    pub fn flush_link(&self) {
        self.inner.flush_link();
    }

    /// Moves into `out` (appending) the numbers of the QPs whose [`QueuePair::stats`] drop
    /// or RC counters or whose state may have changed since the previous call, each once,
    /// and returns `true`; a QP destroyed meanwhile may still be named. Returns `false`
    /// (and appends nothing) on a device that cannot tell (verbs): the caller then reads
    /// every QP. Lets a poller fold QP counters in O(QPs that changed) instead of sweeping
    /// every QP (a soft device marks a QP when a packet was dropped on it, when it moved to
    /// ERROR, and on every packet of an RC QP, whose retransmission counters move often).
    ///
    /// [`QueuePair::stats`]: super::QueuePair::stats
    pub fn take_changed_qps(&self, out: &mut Vec<u32>) -> bool {
        self.inner.take_changed_qps(out)
    }
}

impl From<Arc<dyn DeviceOps>> for Device {
    fn from(inner: Arc<dyn DeviceOps>) -> Self {
        Self { inner }
    }
}

/// An opened device. See [`Device`].
pub trait DeviceOps: Send + Sync + fmt::Debug {
    /// See [`Device::name`].
    fn name(&self) -> &str;
    /// See [`Device::kind`].
    fn kind(&self) -> TransportKind;
    /// See [`Device::port_attr`].
    fn port_attr(&self) -> PortAttr;
    /// See [`Device::alloc_pd`].
    fn alloc_pd(&self) -> Result<Arc<dyn PdOps>, AllocPdError>;
    /// See [`Device::create_cq`].
    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CqOps>, CreateCqError>;
    /// See [`Device::create_comp_channel`].
    fn create_comp_channel(&self) -> Result<Arc<dyn CompChannelOps>, CompChannelError>;
    /// See [`Device::poll_async_event`].
    fn poll_async_event(&self) -> Option<AsyncEvent>;
    /// See [`Device::stats`].
    fn stats(&self) -> DeviceStats;
    /// See [`Device::drive`].
    fn drive(&self) -> usize {
        0
    }
    /// See [`Device::is_driven`].
    fn is_driven(&self) -> bool {
        false
    }
    /// See [`Device::flush_link`].
    fn flush_link(&self) {}
    /// See [`Device::take_changed_qps`]. Default: cannot tell.
    fn take_changed_qps(&self, _out: &mut Vec<u32>) -> bool {
        false
    }
}
