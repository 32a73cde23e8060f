//! The agents' own send and drop counters, as the collector exports them
//! (`uctel_collector_agent_{frames,records}_{sent,dropped}_total`).
//!
//! An agent ships its `uctel_agent_*` counters as metric samples on its `metrics` stream:
//! the very frames a `no_credit` drop discards. So the agent also puts them in every
//! heartbeat on the control connection (`Heartbeat.agent_counters`,
//! `uctel_protocol::control::AgentCounters`), which no data-path drop can starve, and the
//! collector exports them as series of its own.
//!
//! The figures in a heartbeat are cumulative since the agent process started, under a
//! random `counters_epoch` chosen at that start. [`CounterBaseline`] turns them into
//! increases: per agent it remembers the last figures of its most recent
//! [`REMEMBERED_EPOCHS`] counter epochs, and a message adds `value − last` of its own epoch
//! (the whole value for an epoch not seen before: that process's counters started at zero).
//! So the exported counters are monotonic for the collector's lifetime:
//!
//! - a reconnect (new connection epoch, same agent process) continues where the previous
//!   session stopped, with what was dropped while disconnected (`not_connected`) added at the
//!   first heartbeat of the new session;
//! - an agent restart starts a new counter epoch: its counts are added on top (the agent's
//!   own series reset, the collector's do not);
//! - a figure lower than the last one of its epoch (a misbehaving agent) adds nothing and
//!   leaves the last figure in place, so nothing is counted twice when it rises again.
//!
//! While an agent process has not restarted since the collector first heard from it, the
//! collector's series equal the agent's own counters as of its last heartbeat. Sans-IO: the
//! baseline is plain data, [`crate::telemetry::AgentTelemetry::agent_counters`] applies it.

use std::collections::HashMap;

use uctel_protocol::control::{AgentCounters, AgentDropReason};

/// Counter epochs remembered per agent: enough for a restart racing the old process's last
/// heartbeats (two processes of one agent id for a moment), bounded.
pub const REMEMBERED_EPOCHS: usize = 4;

/// One counter of one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CounterKey {
    /// Frames the agent posted on a stream (stream id).
    FramesSent(u32),
    /// Records in the frames the agent posted on a stream.
    RecordsSent(u32),
    /// Frames the agent dropped on a stream for a reason.
    FramesDropped(u32, AgentDropReason),
    /// Records the agent dropped on a stream for a reason.
    RecordsDropped(u32, AgentDropReason),
}

/// The last figures of one agent's recent counter epochs (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct CounterBaseline {
    /// `(counters_epoch, last figure per counter)`, the epoch heard from last at the end.
    epochs: Vec<(u64, HashMap<CounterKey, u64>)>,
}

impl CounterBaseline {
    /// The increase of every counter `c` names since the last message of its counter epoch
    /// (`0` for a counter that did not grow; every counter `c` names is listed, so the
    /// caller can create its series at zero). Unknown drop reasons read as
    /// `AgentDropReason::Unspecified`; a counter named twice in one message counts once, at
    /// its higher figure.
    pub fn increases(&mut self, c: &AgentCounters) -> Vec<(CounterKey, u64)> {
        let pos = self.epochs.iter().position(|(e, _)| *e == c.counters_epoch);
        let mut last = match pos {
            Some(i) => self.epochs.remove(i).1,
            None => HashMap::new(),
        };
        let sent = c.sent.iter().flat_map(|s| {
            [
                (CounterKey::FramesSent(s.stream_id), s.frames),
                (CounterKey::RecordsSent(s.stream_id), s.records),
            ]
        });
        let dropped = c.dropped.iter().flat_map(|d| {
            let reason =
                AgentDropReason::try_from(d.reason).unwrap_or(AgentDropReason::Unspecified);
            [
                (CounterKey::FramesDropped(d.stream_id, reason), d.frames),
                (CounterKey::RecordsDropped(d.stream_id, reason), d.records),
            ]
        });
        let mut out = Vec::with_capacity(c.sent.len() * 2 + c.dropped.len() * 2);
        for (key, value) in sent.chain(dropped) {
            let before = last.entry(key).or_insert(0);
            let grew = value.saturating_sub(*before);
            *before = (*before).max(value);
            out.push((key, grew));
        }
        self.epochs.push((c.counters_epoch, last));
        if self.epochs.len() > REMEMBERED_EPOCHS {
            self.epochs.remove(0);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use uctel_protocol::control::{AgentStreamDropped, AgentStreamSent};

    use super::*;

    fn counters(epoch: u64, sent: u64, no_credit: u64) -> AgentCounters {
        AgentCounters {
            counters_epoch: epoch,
            sent: vec![AgentStreamSent {
                stream_id: 1,
                frames: sent,
                records: sent * 10,
            }],
            dropped: vec![AgentStreamDropped {
                stream_id: 1,
                reason: AgentDropReason::NoCredit as i32,
                frames: no_credit,
                records: no_credit * 10,
            }],
        }
    }

    fn get(v: &[(CounterKey, u64)], k: CounterKey) -> u64 {
        v.iter().filter(|(key, _)| *key == k).map(|(_, n)| n).sum()
    }

    const NO_CREDIT: CounterKey = CounterKey::RecordsDropped(1, AgentDropReason::NoCredit);

    /// Exported total after each message: the running sum of the increases.
    fn totals(b: &mut CounterBaseline, msgs: &[AgentCounters], k: CounterKey) -> Vec<u64> {
        let mut total = 0;
        msgs.iter()
            .map(|m| {
                total += get(&b.increases(m), k);
                total
            })
            .collect()
    }

    #[test]
    fn one_epoch_exports_the_agents_figures() {
        let mut b = CounterBaseline::default();
        let msgs = [
            counters(7, 1, 0),
            counters(7, 5, 2),
            counters(7, 9, 2),
            counters(7, 12, 6),
        ];
        assert_eq!(totals(&mut b, &msgs, NO_CREDIT), [0, 20, 20, 60]);
        let mut b = CounterBaseline::default();
        assert_eq!(
            totals(&mut b, &msgs, CounterKey::FramesSent(1)),
            [1, 5, 9, 12]
        );
    }

    #[test]
    fn every_named_counter_is_listed_even_at_zero() {
        let mut b = CounterBaseline::default();
        let v = b.increases(&counters(1, 0, 0));
        assert_eq!(v.len(), 4);
        assert!(v.iter().all(|(_, n)| *n == 0));
    }

    #[test]
    fn an_agent_restart_adds_on_top() {
        // Epoch 7 dropped 30 records, then the agent restarted (epoch 8) and dropped 10:
        // the collector's counter keeps 30 and adds 10.
        let mut b = CounterBaseline::default();
        let msgs = [counters(7, 3, 3), counters(8, 1, 0), counters(8, 2, 1)];
        assert_eq!(totals(&mut b, &msgs, NO_CREDIT), [30, 30, 40]);
    }

    #[test]
    fn interleaved_epochs_count_each_increase_once() {
        // The old process's last heartbeat arrives after the new process's first.
        let mut b = CounterBaseline::default();
        let msgs = [
            counters(7, 3, 3),
            counters(8, 1, 1),
            counters(7, 4, 4),
            counters(8, 2, 2),
        ];
        assert_eq!(totals(&mut b, &msgs, NO_CREDIT), [30, 40, 50, 60]);
    }

    #[test]
    fn a_decrease_adds_nothing_and_is_not_counted_twice() {
        let mut b = CounterBaseline::default();
        let msgs = [counters(7, 0, 5), counters(7, 0, 2), counters(7, 0, 6)];
        assert_eq!(totals(&mut b, &msgs, NO_CREDIT), [50, 50, 60]);
    }

    #[test]
    fn unknown_reasons_count_as_unspecified_and_epochs_are_bounded() {
        let mut b = CounterBaseline::default();
        let mut c = counters(1, 0, 1);
        c.dropped[0].reason = 999;
        let v = b.increases(&c);
        assert_eq!(
            get(
                &v,
                CounterKey::RecordsDropped(1, AgentDropReason::Unspecified)
            ),
            10
        );
        for e in 2..20 {
            b.increases(&counters(e, 0, 0));
        }
        assert_eq!(b.epochs.len(), REMEMBERED_EPOCHS);
    }
}
