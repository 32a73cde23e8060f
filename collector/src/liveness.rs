//! `uctel_collector_agent_up{agent}`: whether each agent has a live session on this
//! collector, the collector's equivalent of Prometheus' `up` for a scrape target.
//!
//! * `1` from the agent's `Welcome` on.
//! * `0` once its session has ended and no newer connection of the same agent id took over
//!   (`crate::control`): at its `Goodbye`, when its control connection closes or fails, or
//!   when it misses `control.dead_after_missed_heartbeats` heartbeats (the dead-peer rule of
//!   `uctel_protocol::session::liveness`). At the same moment the agent's series leave the
//!   series store (`crate::store::SeriesStore::remove_agent`), so `/metrics` never shows a
//!   gone agent's `node_*` series beside `agent_up 0`.
//! * The `0` stays for `metrics.agent_up_retention_seconds` (default one hour), long enough
//!   for an alert on `max by (agent) (uctel_collector_agent_up) == 0` (`UctelAgentDown`,
//!   `config/prometheus/uctel-rules.yml`) to fire and be seen; then the series goes, so agent
//!   ids that never come back do not pile up. An agent that reconnects is `1` again.
//!
//! An agent moving to another collector of its pool is `0` here and `1` there: take the
//! maximum over collectors (`max by (agent)`) to ask whether it is up anywhere.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::IntGaugeVec;

/// The gauge and, per agent it labels, since when the agent is down (`None`: up).
#[derive(Debug)]
pub struct AgentUp {
    gauge: IntGaugeVec,
    down_since: Mutex<HashMap<String, Option<Instant>>>,
}

impl AgentUp {
    /// Over `gauge` (one label, `agent`), registered by the caller.
    pub fn new(gauge: IntGaugeVec) -> AgentUp {
        AgentUp {
            gauge,
            down_since: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Instant>>> {
        self.down_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `agent` has a live session: `agent_up{agent} 1`.
    pub fn up(&self, agent: &str) {
        let mut map = self.map();
        self.gauge.with_label_values(&[agent]).set(1);
        map.insert(agent.to_owned(), None);
    }

    /// `agent` has no live session any more (as of `now`): `agent_up{agent} 0`. An agent
    /// that was never up (refused before its `Welcome`) gets no series. Returns whether the
    /// agent was up.
    pub fn down(&self, agent: &str, now: Instant) -> bool {
        let mut map = self.map();
        match map.get_mut(agent) {
            Some(state) => {
                let was_up = state.is_none();
                if was_up {
                    *state = Some(now);
                }
                self.gauge.with_label_values(&[agent]).set(0);
                was_up
            }
            None => false,
        }
    }

    /// Removes the series of agents down for at least `keep` at `now`; returns how many.
    pub fn expire(&self, now: Instant, keep: Duration) -> usize {
        let mut map = self.map();
        let before = map.len();
        map.retain(|agent, state| {
            let keep_it = state.is_none_or(|t| now.saturating_duration_since(t) < keep);
            if !keep_it {
                let _ = self.gauge.remove_label_values(&[agent]);
            }
            keep_it
        });
        before - map.len()
    }

    /// Whether `agent` is up (`Some(true)`), down (`Some(false)`) or unknown (`None`).
    pub fn state(&self, agent: &str) -> Option<bool> {
        self.map().get(agent).map(Option::is_none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn agent_up() -> AgentUp {
        AgentUp::new(IntGaugeVec::new(Opts::new("agent_up", "test"), &["agent"]).unwrap())
    }

    fn value(a: &AgentUp, agent: &str) -> Option<i64> {
        use prometheus::core::Collector;
        a.gauge
            .collect()
            .iter()
            .flat_map(|f| f.get_metric().iter())
            .find(|m| m.get_label().iter().any(|l| l.value() == agent))
            .map(|m| m.get_gauge().get_value() as i64)
    }

    #[test]
    fn up_then_down_then_forgotten_after_the_retention() {
        let a = agent_up();
        let t0 = Instant::now();
        a.up("a");
        assert_eq!(value(&a, "a"), Some(1));
        assert!(a.down("a", t0));
        assert_eq!(value(&a, "a"), Some(0));
        // A second end (another session's) keeps the first down time.
        assert!(!a.down("a", t0 + Duration::from_secs(50)));
        assert_eq!(
            a.expire(t0 + Duration::from_secs(59), Duration::from_secs(60)),
            0
        );
        assert_eq!(value(&a, "a"), Some(0));
        assert_eq!(
            a.expire(t0 + Duration::from_secs(60), Duration::from_secs(60)),
            1
        );
        assert_eq!(value(&a, "a"), None);
        assert_eq!(a.state("a"), None);
    }

    #[test]
    fn an_agent_never_up_gets_no_series_and_an_up_one_never_expires() {
        let a = agent_up();
        let t0 = Instant::now();
        assert!(!a.down("never", t0));
        assert_eq!(value(&a, "never"), None);
        a.up("b");
        assert_eq!(a.expire(t0 + Duration::from_secs(3600), Duration::ZERO), 0);
        assert_eq!(a.state("b"), Some(true));
        // Back up after being down.
        a.down("b", t0);
        a.up("b");
        assert_eq!(value(&a, "b"), Some(1));
        assert_eq!(a.expire(t0 + Duration::from_secs(3600), Duration::ZERO), 0);
    }
}
