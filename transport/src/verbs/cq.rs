//! Completion queues ([`VerbsCq`]) with one completion channel each, the API's completion
//! channel over many of them ([`VerbsCompChannel`]), and [`wait_for_completion`].

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use thiserror::Error;

use crate::api::backend::{CompChannelOps, CqOps};
use crate::api::{CompChannelError, CompletionQueue, WorkCompletion};
use crate::sync::lock;
use crate::wake::WakeFd;

use super::codes::{wc_opcode, wc_status};
use super::ffi::{self, RawWc};
use super::shared::{DevShared, QpShared};

/// The verbs CQ behind `cq`, if it belongs to this device.
pub(super) fn verbs_cq<'a>(cq: &'a CompletionQueue, dev: &Arc<DevShared>) -> Option<&'a VerbsCq> {
    let c = cq.backend().as_any().downcast_ref::<VerbsCq>()?;
    Arc::ptr_eq(&c.dev.ctx, &dev.ctx).then_some(c)
}

/// A completion queue with its own completion channel ([`CqOps`]).
pub(super) struct VerbsCq {
    pub(super) cq: Arc<ffi::Cq>,
    pub(super) dev: Arc<DevShared>,
    /// QPs whose send or receive completions land here, by number.
    pub(super) qps: Mutex<HashMap<u32, Weak<QpShared>>>,
    /// Completions read while arming for a blocking wait, handed out by the next `poll`.
    pub(super) stash: Mutex<VecDeque<WorkCompletion>>,
    pub(super) stash_len: AtomicUsize,
}

impl fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerbsCq")
            .field("handle", &self.cq.handle())
            .field("depth", &self.cq.depth())
            .finish_non_exhaustive()
    }
}

impl VerbsCq {
    /// Reads up to `out.len()` completions from the device, hides the ones the transport
    /// signaled on its own, and converts the rest. Returns how many were written.
    pub(super) fn poll_device(&self, out: &mut [WorkCompletion]) -> usize {
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
    pub(super) fn wait(&self, timeout: Duration) -> io::Result<bool> {
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
pub(super) struct VerbsCompChannel {
    pub(super) dev: Arc<DevShared>,
    /// `wake()` makes it readable.
    pub(super) wake: WakeFd,
    /// CQs armed since the last `wait` (kept alive until then).
    pub(super) armed: Mutex<Vec<Arc<ffi::Cq>>>,
    /// `poll_readable` output, kept to reuse its allocation.
    pub(super) ready: Mutex<Vec<bool>>,
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
