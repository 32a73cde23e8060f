//! node_exporter's `infiniband` collector (`collector/infiniband_linux.go`): the RDMA port and
//! driver counters of `<sys>/class/infiniband`, read by [`crate::sources::rdma`].

use uctel_protocol::payload::Metric;

use super::{HostError, Outcome};
use crate::sources::rdma::{PortEvent, RdmaCounters, SkippedFile};

/// `infiniband`: [`RdmaCounters::collect_into`] → `node_infiniband_*`. The files it had to skip
/// go to `skipped` (the collection is then [`Outcome::Partial`]: success 0, the other series
/// kept), the port state and GID changes since the previous collection to `events`.
///
/// # Errors
/// [`HostError::Rdma`] when the counter tree cannot be walked.
pub(super) fn infiniband(
    rdma: &mut RdmaCounters,
    out: &mut Vec<Metric>,
    skipped: &mut Vec<SkippedFile>,
    events: &mut Vec<PortEvent>,
) -> Result<Outcome, HostError> {
    let scan = rdma.collect_into(out)?;
    *skipped = scan.skipped;
    *events = scan.events;
    Ok(if skipped.is_empty() {
        Outcome::Complete
    } else {
        Outcome::Partial
    })
}
