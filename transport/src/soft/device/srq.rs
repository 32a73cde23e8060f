//! Soft shared receive queues ([`SoftSrq`]): one queue of receive WRs that every QP created
//! on it takes from (see [`crate::api::SharedReceiveQueue`] for the rules).

use std::any::Any;
use std::sync::Arc;

use crate::api::backend::SrqOps;
use crate::api::{PostRecvError, RecvWr};
use crate::soft::qp::SrqQueue;

use super::qp::{recv_refusal, recv_wqe};
use super::shared::Shared;

/// Most receive WRs a soft SRQ holds (one per frame of every agent's credit window, with
/// room: 10,000 agents of 64 credits each are 640,000).
pub const MAX_SRQ_WR: u32 = 1 << 22;

/// A soft shared receive queue.
#[derive(Debug)]
pub struct SoftSrq {
    pub(super) queue: Arc<SrqQueue>,
    pub(super) shared: Arc<Shared>,
}

impl SrqOps for SoftSrq {
    fn max_wr(&self) -> u32 {
        self.queue.max_wr
    }

    fn posted(&self) -> Option<u32> {
        Some(u32::try_from(self.queue.len()).unwrap_or(u32::MAX))
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostRecvError> {
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |kind| PostRecvError {
                qpn: 0,
                posted: i,
                kind,
            };
            let wqe = recv_wqe(&self.shared, wr).map_err(fail)?;
            self.queue.post(wqe).map_err(|r| fail(recv_refusal(r)))?;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
