//! The `pod_resources` source's loop (`sources::pod_resources`): one `List` call to the
//! kubelet per aligned round, its labels handed to the host-metrics and fast-counter
//! threads through [`PodLabels`].

use std::sync::Arc;

use uctel_common::shutdown::Shutdown;
use uctel_protocol::payload::Metric;

use super::offer;
use super::rounds::{next_round, RoundMetrics};
use crate::config::seconds;
use crate::pacing::grid::Grid;
use crate::queue::RecordQueue;
use crate::selfmetrics::SelfMetrics;
use crate::sources::pod_resources::{client, PodAttribution, PodLabels, PodResourcesSection};
use crate::stream::Stream;

/// Runs the pod-resources source until shutdown. A failed call is counted in
/// `uctel_agent_source_errors_total{source="pod_resources",reason}` (logged at `warn` once
/// per reason until a call succeeds; `permission_denied` names the unit's drop-in
/// `pod-resources.conf`) and clears the labels; pairs over `max_devices` are counted as
/// `reason="device_cap"` at every call.
pub async fn pod_resources_loop(
    section: PodResourcesSection,
    labels: PodLabels,
    queue: RecordQueue<Metric>,
    (stats, rounds): (Arc<SelfMetrics>, RoundMetrics),
    mut shutdown: Shutdown,
) {
    let mut grid = Grid::new(
        seconds(section.interval_seconds),
        seconds(section.offset_seconds),
    );
    let timeout = seconds(section.timeout_seconds);
    let mut state = PodAttribution::default();
    let mut warned = std::collections::HashSet::new();
    while let Some(began) = next_round(&mut grid, &mut shutdown).await {
        rounds.observe("pod_resources", &began);
        let listed = tokio::select! {
            l = client::list(&section.socket_path, timeout) => l,
            () = shutdown.wait() => return,
        };
        let pods = match listed {
            Ok(pods) => {
                if !warned.is_empty() {
                    tracing::info!("pod_resources: the kubelet answers again");
                    warned.clear();
                }
                Some(pods)
            }
            Err(e) => {
                stats.source_error("pod_resources", e.reason);
                if e.reason == "permission_denied" && warned.insert(e.reason) {
                    tracing::warn!(socket = %section.socket_path.display(), detail = %e.detail, "pod_resources: permission denied on the kubelet's pod-resources socket: connecting needs write permission on it (the kubelet makes it root's only), which the packaged unit's drop-in pod-resources.conf grants (CAP_DAC_OVERRIDE; /usr/share/doc/uctel-agent/examples/pod-resources.conf); counted in uctel_agent_source_errors_total{{source=\"pod_resources\",reason=\"permission_denied\"}}, device series carry no pod labels until it connects (logged once)");
                } else if warned.insert(e.reason) {
                    tracing::warn!(reason = e.reason, detail = %e.detail, "pod_resources: List failed; device series carry no pod labels until it answers (logged once per reason)");
                } else {
                    tracing::debug!(reason = e.reason, detail = %e.detail, "pod_resources: List failed");
                }
                None
            }
        };
        let section = section.clone();
        let Ok(c) = tokio::task::spawn_blocking(move || {
            let mut state = state;
            let c = state.update(&section, pods.as_deref());
            (state, c)
        })
        .await
        else {
            tracing::error!("pod_resources: attribution panicked; the source stops");
            labels.set(Default::default());
            return;
        };
        state = c.0;
        let c = c.1;
        if c.capped > 0 {
            stats.source_errors_add("pod_resources", "device_cap", c.capped);
        }
        labels.set(c.device_labels);
        offer(&queue, c.metrics, Stream::Metrics, &stats, began.unix_ms());
    }
}
