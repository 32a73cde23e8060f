//! Soft completion queues ([`SoftCq`]) and completion channels ([`SoftCompChannel`]).

use std::any::Any;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::api::backend::{CompChannelOps, CqOps};
use crate::api::{CompChannelError, CompletionQueue, WorkCompletion};
use crate::sync::lock;
use crate::wake::{deadline_after, sleep_until, WakeFd};

use super::shared::{CqInner, Shared};

/// A soft completion queue.
#[derive(Debug)]
pub struct SoftCq {
    pub(super) inner: Arc<CqInner>,
    pub(super) device: Weak<Shared>,
    /// `busy_poll` mode: every poll first drives the device.
    pub(super) busy_poll: bool,
}

impl CqOps for SoftCq {
    fn depth(&self) -> u32 {
        u32::try_from(self.inner.depth).unwrap_or(u32::MAX)
    }

    fn handle(&self) -> u32 {
        self.inner.handle
    }

    fn poll(&self, wcs: &mut [WorkCompletion]) -> usize {
        if self.busy_poll {
            if let Some(dev) = self.device.upgrade() {
                dev.progress(Some(Duration::ZERO), false);
            }
        }
        let mut q = lock(&self.inner.wcs);
        let mut n = 0;
        for slot in wcs.iter_mut() {
            match q.pop_front() {
                Some(wc) => {
                    *slot = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A soft completion channel: an eventfd the device signals for armed CQs (see the module
/// docs). On a `busy_poll` or `driven` device its `wait` drives the device while it waits.
#[derive(Debug)]
pub struct SoftCompChannel {
    pub(super) wake: Arc<WakeFd>,
    pub(super) device: Weak<Shared>,
}

impl CompChannelOps for SoftCompChannel {
    fn req_notify(&self, cq: &CompletionQueue) -> Result<(), CompChannelError> {
        let soft = cq
            .backend()
            .as_any()
            .downcast_ref::<SoftCq>()
            .filter(|c| Weak::ptr_eq(&c.device, &self.device))
            .ok_or(CompChannelError::ForeignCq {
                handle: cq.handle(),
            })?;
        {
            let mut ch = lock(&soft.inner.channel);
            if !ch.as_ref().is_some_and(|w| Arc::ptr_eq(w, &self.wake)) {
                *ch = Some(Arc::clone(&self.wake));
            }
        }
        soft.inner.armed.store(true, Ordering::Release);
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<bool, CompChannelError> {
        let deadline = deadline_after(timeout);
        let io_err = |e: io::Error| CompChannelError::Device {
            what: "poll",
            detail: e.to_string(),
        };
        match self.device.upgrade() {
            Some(dev) if dev.busy_poll => dev.drive_until(&self.wake, deadline).map_err(io_err),
            _ => sleep_until(&self.wake, None, deadline)
                .map(|w| w.wake)
                .map_err(io_err),
        }
    }

    fn wake(&self) {
        self.wake.wake();
    }
}
