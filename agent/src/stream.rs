//! The agent's streams.
//!
//! A stream is one sequence-numbered flow of frames of one kind on a connection
//! (DESIGN.md §3 rule 4: every frame carries its stream id and stream sequence). The agent ships
//! three: host and self metrics, log lines, and high-frequency counter samples. The names are the `stream` label values of the
//! agent's and the collector's self-metrics.

use serde::{Deserialize, Serialize};

/// One of the agent's streams. Closed set, so the `stream` label has bounded cardinality.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Metric samples (`kind = metrics` frames, stream id 1).
    Metrics,
    /// Log records (`kind = logs` frames, stream id 2).
    Logs,
    /// High-frequency counter samples (`sources.fast_counters`; `kind = samples` frames,
    /// stream id 3).
    FastCounters,
}

impl Stream {
    /// Every stream, in stream-id order.
    pub const ALL: [Stream; 3] = [Stream::Metrics, Stream::Logs, Stream::FastCounters];

    /// The `stream` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Metrics => "metrics",
            Stream::Logs => "logs",
            Stream::FastCounters => "fast_counters",
        }
    }

    /// The stream id written into the frame header.
    pub fn id(self) -> u32 {
        match self {
            Stream::Metrics => uctel_protocol::stream::METRICS,
            Stream::Logs => uctel_protocol::stream::LOGS,
            Stream::FastCounters => uctel_protocol::stream::FAST_COUNTERS,
        }
    }

    /// The stream with header stream id `id`, if any.
    pub fn from_id(id: u32) -> Option<Stream> {
        Stream::ALL.into_iter().find(|s| s.id() == id)
    }

    /// Position in [`Stream::ALL`], for per-stream arrays.
    pub fn index(self) -> usize {
        match self {
            Stream::Metrics => 0,
            Stream::Logs => 1,
            Stream::FastCounters => 2,
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_indices_round_trip() {
        for (i, s) in Stream::ALL.into_iter().enumerate() {
            assert_eq!(Stream::from_id(s.id()), Some(s));
            assert_eq!(s.index(), i);
        }
        assert_eq!(Stream::from_id(0), None);
        assert_eq!(Stream::from_id(4), None);
    }
}
