//! The per-agent families the status API reads ([`crate::status`]), collected without the
//! series store (a `/metrics` scrape's cost), so the status window can sample them every
//! second.

use prometheus::core::Collector;
use uctel_common::status::Samples;

use super::Telemetry;

impl Telemetry {
    /// The per-agent families (`frames_received_total`, `frames_lost_total`,
    /// `records_*_total`, `frames_missing`, drops, `agent_*` from heartbeats,
    /// `ring_slots_in_use`, `loss_ratio`), flattened, with their full `uctel_collector_`
    /// names as on `/metrics`.
    pub fn status_samples(&self) -> Samples {
        let f = &self.inner;
        let collectors: [&dyn Collector; 16] = [
            &f.frames_received,
            &f.frames_lost,
            &f.records_received,
            &f.records_lost,
            &f.records_replayed,
            &f.frames_dropped,
            &f.records_dropped,
            &f.frames_missing,
            &f.frames_late,
            &f.loss_ratio,
            &f.ring_slots_in_use,
            &f.agent_frames_sent,
            &f.agent_records_sent,
            &f.agent_frames_dropped,
            &f.agent_records_dropped,
            &f.sessions_ended,
        ];
        let families: Vec<_> = collectors.iter().flat_map(|c| c.collect()).collect();
        Samples::from_families(&families)
    }
}
