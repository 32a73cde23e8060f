//! [`CompletionQueue`] (`struct ibv_cq`), [`CompletionChannel`] (`struct ibv_comp_channel`)
//! and their backend traits [`CqOps`] and [`CompChannelOps`].

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::error::CompChannelError;
use super::wr::WorkCompletion;

/// A completion queue (`struct ibv_cq`). Cheap to clone (shared); `Send + Sync`.
#[derive(Clone, Debug)]
pub struct CompletionQueue {
    inner: Arc<dyn CqOps>,
}

impl CompletionQueue {
    /// Wraps a transport's CQ implementation.
    pub fn from_backend(inner: Arc<dyn CqOps>) -> Self {
        Self { inner }
    }

    /// The backend object (for transport implementations).
    pub fn backend(&self) -> &Arc<dyn CqOps> {
        &self.inner
    }

    /// Capacity in completions.
    pub fn depth(&self) -> u32 {
        self.inner.depth()
    }

    /// A number identifying this CQ within its device (used by [`AsyncEvent::CqError`]).
    ///
    /// [`AsyncEvent::CqError`]: super::AsyncEvent::CqError
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }

    /// Moves up to `wcs.len()` completions, oldest first, into `wcs` and returns how many
    /// (`ibv_poll_cq`). Never blocks.
    ///
    /// On the soft transport in busy-poll mode this call also drives the device (sends queued
    /// packets, receives and processes arrived ones) before taking completions.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> usize {
        self.inner.poll(wcs)
    }
}

/// A completion channel (`struct ibv_comp_channel`): where a poller sleeps while its CQs are
/// empty. Cheap to clone (shared); `Send + Sync`.
///
/// The protocol is the one of ibv_get_cq_event(3), for any number of CQs of one device:
///
/// 1. poll every CQ until it is empty;
/// 2. [`req_notify`](CompletionChannel::req_notify) each CQ (one-shot: the next completion
///    added to it wakes the channel once);
/// 3. poll every CQ once more — a completion that arrived before the CQ was armed raises no
///    notification — and go back to 1 if any had one;
/// 4. [`wait`](CompletionChannel::wait), then go back to 1.
///
/// [`wake`](CompletionChannel::wake) makes a current or the next `wait` return at once, from
/// any thread (new work that is not a completion: a CQ to add, a shutdown).
///
/// Verbs: each CQ has its own `ibv_comp_channel`; `wait` sleeps in `poll(2)` on the channels
/// of the armed CQs and an eventfd, and takes and acknowledges their events. Soft: an armed
/// CQ signals the channel's eventfd when the device pushes a completion into it; on a device
/// in `busy_poll` or `driven` mode `wait` also drives the device (it sleeps on the UDP
/// socket).
#[derive(Clone, Debug)]
pub struct CompletionChannel {
    inner: Arc<dyn CompChannelOps>,
}

impl CompletionChannel {
    /// Wraps a transport's completion channel.
    pub fn from_backend(inner: Arc<dyn CompChannelOps>) -> Self {
        Self { inner }
    }

    /// Arms `cq` (`ibv_req_notify_cq(cq, 0)`): its next completion wakes this channel. One-shot;
    /// arming an armed CQ again is harmless.
    ///
    /// # Errors
    /// [`CompChannelError::ForeignCq`] for a CQ of another device; [`CompChannelError::Device`]
    /// when the device refuses.
    pub fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError> {
        self.inner.req_notify(cq)
    }

    /// Sleeps until an armed CQ received a completion, [`CompletionChannel::wake`] was called,
    /// or `timeout` passed. Returns `true` when woken (poll the CQs), `false` on timeout.
    /// Consumes the notifications; CQs must be armed again before the next wait. A wake-up
    /// may be spurious; the caller re-polls anyway.
    ///
    /// # Errors
    /// [`CompChannelError::Device`] when waiting fails (not for timeouts or signals).
    pub fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError> {
        self.inner.wait(timeout)
    }

    /// Makes a current or the next [`CompletionChannel::wait`] return `true` at once.
    pub fn wake(&self) {
        self.inner.wake();
    }
}

/// A completion queue. See [`CompletionQueue`].
pub trait CqOps: Send + Sync + fmt::Debug {
    /// See [`CompletionQueue::depth`].
    fn depth(&self) -> u32;
    /// See [`CompletionQueue::handle`].
    fn handle(&self) -> u32;
    /// See [`CompletionQueue::poll`].
    fn poll(&self, wcs: &mut [WorkCompletion]) -> usize;
    /// For the owning transport to recover its concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// A completion channel. See [`CompletionChannel`].
pub trait CompChannelOps: Send + Sync + fmt::Debug {
    /// See [`CompletionChannel::req_notify`].
    fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError>;
    /// See [`CompletionChannel::wait`].
    fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError>;
    /// See [`CompletionChannel::wake`].
    fn wake(&self);
}
