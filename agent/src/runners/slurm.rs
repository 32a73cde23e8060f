//! The `slurm` source's thread (`sources::slurm`): one look at the job cgroups per aligned
//! round, on a thread of its own (directory walks and `scontrol` are blocking).

use std::sync::Arc;

use uctel_common::shutdown::Shutdown;
use uctel_protocol::payload::Metric;

use super::rounds::{next_round_blocking, RoundMetrics};
use super::{offer, run_thread};
use crate::config::seconds;
use crate::pacing::grid::Grid;
use crate::queue::RecordQueue;
use crate::selfmetrics::SelfMetrics;
use crate::sources::slurm::{scontrol_job, SlurmJobs, SlurmSection};
use crate::stream::Stream;

/// Runs the Slurm source until shutdown. Jobs over `max_jobs` are counted in
/// `uctel_agent_source_errors_total{source="slurm",reason="job_cap"}` at every round,
/// failed `scontrol` lookups as `reason="scontrol"` (logged once per job at `warn`).
pub async fn slurm_loop(
    section: SlurmSection,
    queue: RecordQueue<Metric>,
    (stats, rounds): (Arc<SelfMetrics>, RoundMetrics),
    mut shutdown: Shutdown,
) {
    run_thread("slurm", &mut shutdown, move |stop| {
        let mut grid = Grid::new(
            seconds(section.interval_seconds),
            seconds(section.offset_seconds),
        );
        let mut jobs = SlurmJobs::default();
        let mut warned = std::collections::HashSet::new();
        while let Some(began) = next_round_blocking(&mut grid, stop) {
            rounds.observe("slurm", &began);
            let c = jobs.collect(&section, |id| scontrol_job(&section.scontrol_path, id));
            if c.capped > 0 {
                stats.source_errors_add("slurm", "job_cap", c.capped);
            }
            for (id, e) in &c.lookup_errors {
                stats.source_error("slurm", "scontrol");
                if warned.insert(*id) {
                    tracing::warn!(job_id = id, error = %e, "slurm: scontrol failed; the job is exported without its labels until it answers");
                }
            }
            offer(&queue, c.metrics, Stream::Metrics, &stats, began.unix_ms());
        }
    })
    .await;
}
