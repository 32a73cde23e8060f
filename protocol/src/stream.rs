//! Well-known stream ids and their names.
//!
//! Every frame carries a 32-bit stream id (DESIGN.md §3 rule 4). The agent ships two streams,
//! metric samples on stream id [`METRICS`] and log records on stream id [`LOGS`]; both sides
//! label their per-stream self-metrics with the stream's *name* (`stream="metrics"`,
//! `stream="logs"`), so an agent's `uctel_agent_frames_sent_total{stream}` and a collector's
//! `uctel_collector_frames_received_total{stream}` match in PromQL. A stream id without a
//! well-known name (another sender, a future stream) is named by its decimal number, which
//! can never be mistaken for a well-known name.

use std::fmt;

/// Stream id of metric samples (`kind = metrics` frames).
pub const METRICS: u32 = 1;

/// Stream id of log records (`kind = logs` frames).
pub const LOGS: u32 = 2;

/// Stream id of the agent's high-frequency counter samples (`kind = samples` frames).
pub const FAST_COUNTERS: u32 = 3;

/// Every well-known stream: `(stream id, name)`, in stream-id order.
pub const WELL_KNOWN: [(u32, &str); 3] = [
    (METRICS, "metrics"),
    (LOGS, "logs"),
    (FAST_COUNTERS, "fast_counters"),
];

/// The name of a well-known stream id, `None` for any other id.
pub fn well_known_name(id: u32) -> Option<&'static str> {
    WELL_KNOWN.iter().find(|(i, _)| *i == id).map(|(_, n)| *n)
}

/// The stream id a name stands for: a well-known name, or a decimal number (the name of an
/// id without a well-known name). `None` for anything else.
pub fn id_from_name(name: &str) -> Option<u32> {
    WELL_KNOWN
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(i, _)| *i)
        .or_else(|| name.parse().ok())
}

/// The `stream` label value of a stream id: its well-known name, else its decimal number.
/// Allocates only for ids without a well-known name.
pub fn label(id: u32) -> std::borrow::Cow<'static, str> {
    match well_known_name(id) {
        Some(n) => std::borrow::Cow::Borrowed(n),
        None => std::borrow::Cow::Owned(id.to_string()),
    }
}

/// Displays a stream id as its name ([`label`]) without allocating: `metrics`, `logs`, `7`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamName(pub u32);

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match well_known_name(self.0) {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        assert_eq!(label(METRICS), "metrics");
        assert_eq!(label(LOGS), "logs");
        assert_eq!(label(0), "0");
        assert_eq!(label(7), "7");
        assert_eq!(label(u32::MAX), u32::MAX.to_string());
        for id in [0, METRICS, LOGS, FAST_COUNTERS, 4, 1000, u32::MAX] {
            assert_eq!(StreamName(id).to_string(), label(id));
            assert_eq!(id_from_name(&label(id)), Some(id));
        }
        assert_eq!(id_from_name("metric"), None);
        assert_eq!(id_from_name("-1"), None);
    }
}
