//! The fleet rows of issue 42: what 10,000 agents cost one collector.
//!
//! * **fleet**: K agents each offering a host's rate (`--fleet-fps`, 20 frames/s by
//!   default: a host collection, logs and fast counters), paced by the generator; every
//!   frame must be accepted, with no socket drop, no loss, `unaccounted 0`, Jain ≥ 0.95.
//! * **upkeep**: K connected agents that send one frame each at the start and then only
//!   what keeps their sessions alive (heartbeats, reports, credit); the collector's CPU per
//!   agent-second over the window, by thread, must stay ≤ 5 µs (5 % of one core for 10,000).
//! * **upkeep, credit writes batched**: the upkeep run twice in one bench run, the agents'
//!   credits written into their memory both times: the collector's credit writes batched
//!   across agents (`control.credit_write_batching: true`, one `sendmmsg` per round) and
//!   each posted on its own (`false`); the row is the ratio of their CPU per agent-second.
//! * **scaling per core**: frames per collector CPU-s at the largest scaling K against the
//!   same run's K = 10 (≥ 0.5×).
//!
//! Every ratio is within one run; the generator shares the machine, and its CPU is given
//! beside the collector's (`generator_cpu` of each run).

use crate::softpath::SoftRunResult;
use crate::stats::{Goal, Target, Verdict};

/// Collector CPU per agent-second at upkeep, microseconds (issue 42: ≤ 5 % of one core for
/// 10,000 agents).
pub const UPKEEP_US_PER_AGENT_SECOND: f64 = 5.0;
/// Frames per collector CPU-s at the largest K against K = 10 (issue 42).
pub const SCALING_PER_CORE_VS_K10: f64 = 0.5;
/// Jain index the fleet run must reach.
pub const FLEET_JAIN: f64 = 0.95;

/// Collector CPU microseconds per agent-second over the run's window.
pub fn upkeep_us_per_agent_second(r: &SoftRunResult) -> f64 {
    let agent_seconds = r.agents as f64 * r.collector_cpu.wall_seconds;
    if agent_seconds > 0.0 {
        r.collector_cpu.cpu_seconds * 1e6 / agent_seconds
    } else {
        f64::NAN
    }
}

/// The targets of the fleet, upkeep and scaling-per-core rows present in a report.
pub fn targets(
    scaling: &[SoftRunResult],
    fleet: Option<&SoftRunResult>,
    upkeep: Option<&SoftRunResult>,
) -> Vec<Target> {
    let mut t = Vec::new();
    let k10 = scaling.iter().find(|r| r.agents == 10);
    let big = scaling
        .iter()
        .filter(|r| r.agents > 10)
        .max_by_key(|r| r.agents);
    if let (Some(k10), Some(big)) = (k10, big) {
        t.push(Target {
            name: format!("collector frames per CPU-s, K = {} vs K = 10", big.agents),
            rule: format!("≥ {SCALING_PER_CORE_VS_K10} × the same run's K = 10"),
            verdict: Verdict::check(
                big.frames_per_core_sec / k10.frames_per_core_sec,
                SCALING_PER_CORE_VS_K10,
                Goal::AtLeast,
            ),
        });
    }
    if let Some(f) = fleet {
        let a = &f.accounting;
        t.push(Target {
            name: format!("fleet K = {}: every offered frame accepted", f.agents),
            rule: "sent − received = 0".into(),
            verdict: Verdict::check(a.sent as f64 - a.received, 0.0, Goal::AtMost),
        });
        t.push(Target {
            name: format!("fleet K = {}: fairness", f.agents),
            rule: format!("Jain index of per-agent frames/s ≥ {FLEET_JAIN}"),
            verdict: Verdict::check(
                f.fairness.map_or(f64::NAN, |s| s.jain),
                FLEET_JAIN,
                Goal::AtLeast,
            ),
        });
    }
    if let Some(u) = upkeep {
        t.push(Target {
            name: format!("upkeep K = {}: collector CPU per agent-second", u.agents),
            rule: format!("≤ {UPKEEP_US_PER_AGENT_SECOND} µs"),
            verdict: Verdict::check(
                upkeep_us_per_agent_second(u),
                UPKEEP_US_PER_AGENT_SECOND,
                Goal::AtMost,
            ),
        });
    }
    t
}

/// The upkeep run with the agents' credits written into their memory, the collector's
/// writes batched across agents and each posted alone, in one bench run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct UpkeepBatching {
    /// `control.credit_write_batching: true`.
    pub batched: SoftRunResult,
    /// `control.credit_write_batching: false`.
    pub unbatched: SoftRunResult,
}

impl UpkeepBatching {
    /// Collector CPU per agent-second batched ÷ unbatched (below 1: batching saves).
    pub fn ratio(&self) -> f64 {
        upkeep_us_per_agent_second(&self.batched) / upkeep_us_per_agent_second(&self.unbatched)
    }

    /// The row's text: both figures, the ratio, and each run's CPU by thread.
    pub fn line(&self) -> String {
        let b = &self.batched;
        let per_batch = b.credit_writes_per_sec * b.collector_cpu.wall_seconds
            / b.credit_write_batches.max(1.0);
        format!(
            "{:.2} µs batched vs {:.2} µs each write alone per agent-second: {:.3}× \
             (credit writes/s {:.0} batched, {:.1} per batch; {:.0} alone) ({} | {})",
            upkeep_us_per_agent_second(&self.batched),
            upkeep_us_per_agent_second(&self.unbatched),
            self.ratio(),
            b.credit_writes_per_sec,
            per_batch,
            self.unbatched.credit_writes_per_sec,
            upkeep_line(&self.batched),
            upkeep_line(&self.unbatched),
        )
    }
}

/// The upkeep row's text: CPU per agent-second and by thread.
pub fn upkeep_line(u: &SoftRunResult) -> String {
    let threads: Vec<String> = u
        .collector_cpu
        .by_thread
        .iter()
        .filter(|(_, s)| **s > 0.0)
        .map(|(name, s)| format!("{name} {s:.2} CPU-s"))
        .collect();
    format!(
        "upkeep K = {}: {:.2} µs collector CPU per agent-second ({:.3} cores over {:.1} s; {}); generator {:.3} cores",
        u.agents,
        upkeep_us_per_agent_second(u),
        u.collector_cpu.cores,
        u.collector_cpu.wall_seconds,
        threads.join(", "),
        u.generator_cpu.as_ref().map_or(f64::NAN, |g| g.cores),
    )
}
