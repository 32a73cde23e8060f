//! Shared receive queues ([`VerbsSrq`], the API's [`SrqOps`]): `ibv_create_srq` with one SGE
//! per WR, `ibv_post_srq_recv` with ibverbs `bad_wr` semantics, the limit event armed with
//! `ibv_modify_srq`, and the receive-WR conversion the QP's own receive queue shares.
//!
//! Lifetimes: a QP created on the SRQ holds it (`ffi::Qp` keeps an `Arc<ffi::Srq>`) and the
//! SRQ holds its PD, so `ibv_destroy_qp` runs before `ibv_destroy_srq`, and that before
//! `ibv_dealloc_pd`, whatever order the handles are dropped in (ibv_destroy_srq(3) fails
//! while a QP is associated with the SRQ).

use std::any::Any;
use std::sync::Arc;

use crate::api::backend::SrqOps;
use crate::api::{PostRecvError, PostRecvErrorKind, QpState, RecvWr};
use crate::sync::lock;

use super::ffi::{self, RecvWrRaw};
use super::mr::{resolve_sge, SgeProblem};
use super::shared::SrqShared;

/// Checks one receive WR against `pd` (its SGE must lie in a LOCAL_WRITE MR of the PD) and
/// converts it.
pub(super) fn build_recv(
    wr: &RecvWr<'_>,
    pd: &Arc<ffi::Pd>,
) -> Result<RecvWrRaw, PostRecvErrorKind> {
    let sge = match &wr.sge {
        None => None,
        Some(sge) => Some(resolve_sge(sge, pd, true).map_err(|p| match p {
            SgeProblem::Foreign { lkey } => PostRecvErrorKind::ForeignMr { lkey },
            SgeProblem::NoLocalWrite { lkey } => PostRecvErrorKind::NoLocalWrite { lkey },
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
        })?),
    };
    Ok(RecvWrRaw {
        wr_id: wr.wr_id,
        sge,
    })
}

/// A shared receive queue of a verbs device ([`SrqOps`]).
#[derive(Debug)]
pub(super) struct VerbsSrq {
    pub(super) shared: Arc<SrqShared>,
}

impl SrqOps for VerbsSrq {
    fn max_wr(&self) -> u32 {
        self.shared.srq.max_wr()
    }

    fn posted(&self) -> Option<u32> {
        // The provider does not tell how many WRs the device took.
        None
    }

    fn handle(&self) -> u32 {
        self.shared.srq.handle()
    }

    fn arm_limit(&self, limit: u32) -> bool {
        match self.shared.srq.arm_limit(limit) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(srq = self.shared.srq.handle(), limit, error = %e, "ibv_modify_srq(IBV_SRQ_LIMIT) failed");
                false
            }
        }
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        let s = &self.shared;
        let fail = |posted, kind| PostRecvError {
            qpn: 0,
            posted,
            kind,
        };
        let mut raw = lock(&s.recv_scratch);
        let mut done = 0usize;
        for chunk in wrs.chunks(ffi::POST_BATCH) {
            raw.clear();
            let mut invalid = None;
            for wr in chunk {
                match build_recv(wr, &s.pd) {
                    Ok(r) => raw.push(r),
                    Err(kind) => {
                        invalid = Some(kind);
                        break;
                    }
                }
            }
            let result = s.srq.post_recv(&raw);
            let posted = match &result {
                Ok(()) => raw.len(),
                Err((p, _)) => *p,
            };
            let at = done + posted;
            if let Err((_, e)) = result {
                // ENOMEM: the SRQ is full (ibv_post_srq_recv(3)); anything else: the SRQ is
                // in error (IBV_EVENT_SRQ_ERR), reported as a receive queue in ERROR.
                tracing::debug!(srq = s.srq.handle(), error = %e, "SRQ receive WR refused by the provider");
                let kind = if e.raw_os_error() == Some(libc::ENOMEM) {
                    PostRecvErrorKind::Full {
                        depth: s.srq.max_wr(),
                    }
                } else {
                    PostRecvErrorKind::InvalidState {
                        state: QpState::Error,
                    }
                };
                return Err(fail(at, kind));
            }
            if let Some(kind) = invalid {
                return Err(fail(at, kind));
            }
            done = at;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
