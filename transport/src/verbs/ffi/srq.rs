//! Shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq`,
//! `ibv_destroy_srq`) as an owned RAII type: part of [`super`], the verbs transport's only
//! `unsafe` code, with the same rules (a `// SAFETY:` note per block).

use std::io;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use super::{error_from_ret, last_error, post_recv_chain, Pd, RecvWrRaw};

/// `IBV_SRQ_LIMIT` (enum ibv_srq_attr_mask): `ibv_modify_srq` arms the limit event.
const SRQ_ATTR_LIMIT: c_int = 1 << 1;

/// A shared receive queue (`ibv_create_srq`), destroyed on drop. QPs created on it hold an
/// `Arc` to it, so it is destroyed after them (ibv_destroy_srq(3) fails while a QP uses it),
/// and it holds its PD, so the PD goes last.
pub(crate) struct Srq {
    pub(super) ptr: NonNull<sys::ibv_srq>,
    max_wr: u32,
    _pd: Arc<Pd>,
}

// SAFETY: see `Context`; the provider serialises post_srq_recv on one SRQ (rxe takes the
// queue's producer lock).
unsafe impl Send for Srq {}
// SAFETY: no Rust-side mutable state.
unsafe impl Sync for Srq {}

impl Srq {
    /// `ibv_create_srq(pd, {max_wr, max_sge = 1, srq_limit = 0})`: no limit event until
    /// [`Srq::arm_limit`]. Returns the SRQ with the capacity the provider granted (at least
    /// `max_wr`).
    pub(crate) fn new(pd: &Arc<Pd>, max_wr: u32) -> io::Result<Arc<Self>> {
        // SAFETY: ibv_srq_init_attr is plain old data; all-zero (null context) is valid.
        let mut init: sys::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = max_wr;
        init.attr.max_sge = 1;
        init.attr.srq_limit = 0;
        // SAFETY: live PD; `init` is valid for the call and updated with the granted sizes.
        let p = unsafe { sys::ibv_create_srq(pd.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(p).ok_or_else(last_error)?;
        Ok(Arc::new(Self {
            ptr,
            max_wr: init.attr.max_wr.max(max_wr),
            _pd: Arc::clone(pd),
        }))
    }

    /// Capacity in receive WRs, as granted.
    pub(crate) fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// The kernel's handle of this SRQ (`ibv_srq.handle`), as named by SRQ async events.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: plain field of the live SRQ.
        unsafe { (*self.ptr.as_ptr()).handle }
    }

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: one `IBV_EVENT_SRQ_LIMIT_REACHED` once fewer than
    /// `limit` WRs are posted (the event disarms it; IBTA 10.2.9.3, ibv_modify_srq(3)).
    pub(crate) fn arm_limit(&self, limit: u32) -> io::Result<()> {
        let mut attr = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ; `attr` is valid for the call.
        let ret = unsafe { sys::ibv_modify_srq(self.ptr.as_ptr(), &mut attr, SRQ_ATTR_LIMIT) };
        if ret != 0 {
            return Err(error_from_ret(ret));
        }
        Ok(())
    }

    /// `ibv_post_srq_recv` of up to [`POST_BATCH`](super::POST_BATCH) WRs chained in order; as
    /// [`Qp::post_recv`](super::Qp::post_recv).
    pub(crate) fn post_recv(&self, wrs: &[RecvWrRaw]) -> Result<(), (usize, io::Error)> {
        let srq = self.ptr.as_ptr();
        // SAFETY: live SRQ; the chain and its SGEs are valid for the call (`post_recv_chain`).
        post_recv_chain(wrs, |wr, bad| unsafe {
            sys::ibv_post_srq_recv(srq, wr, bad)
        })
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: destroyed once; every QP on it holds an Arc<Srq>, so none is alive, and the
        // PD is kept alive by `_pd` until after this call.
        let ret = unsafe { sys::ibv_destroy_srq(self.ptr.as_ptr()) };
        if ret != 0 {
            tracing::warn!(error = %error_from_ret(ret), "ibv_destroy_srq failed");
        }
    }
}
