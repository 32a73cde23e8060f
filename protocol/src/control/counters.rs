//! The agent's own send and drop counters, carried in its heartbeats
//! (`Heartbeat.agent_counters`): cumulative since the agent process started, so that a drop
//! can never hide the count of itself (a `no_credit` drop starves the data path, never the
//! control connection).

use super::{invalid, InvalidMessage};

/// Why the agent dropped frames or records before posting them: the `reason` label of the
/// agent's `uctel_agent_records_dropped_total` and of the collector's
/// `uctel_collector_agent_records_dropped_total`. A closed set, the agent's own reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AgentDropReason {
    /// Not set (or a value from a newer version).
    Unspecified = 0,
    /// The credit window was full (DESIGN.md §4).
    NoCredit = 1,
    /// The transport's send queue stayed full while the stream's frame queue was full too.
    SendQueueFull = 2,
    /// A single record larger than the largest frame.
    Oversize = 3,
    /// A record the frame codec would reject.
    Invalid = 4,
    /// The bounded queue between a source and the sender was full.
    SourceOverflow = 5,
    /// No connection to the collector.
    NotConnected = 6,
    /// The transport refused or failed the post.
    TransportError = 7,
    /// Still queued when the agent shut down.
    Shutdown = 8,
    /// Kernel log records overwritten in the kernel's ring buffer before the agent read
    /// them (counted from the gap in the kernel's sequence numbers).
    KmsgOverwritten = 9,
    /// systemd journal entries deleted from the journal before the agent read them
    /// (counted from the gap in the journal's sequence numbers).
    JournalVacuumed = 10,
}

impl AgentDropReason {
    /// Every reason but `Unspecified`, in wire order.
    pub const ALL: [AgentDropReason; 10] = [
        AgentDropReason::NoCredit,
        AgentDropReason::SendQueueFull,
        AgentDropReason::Oversize,
        AgentDropReason::Invalid,
        AgentDropReason::SourceOverflow,
        AgentDropReason::NotConnected,
        AgentDropReason::TransportError,
        AgentDropReason::Shutdown,
        AgentDropReason::KmsgOverwritten,
        AgentDropReason::JournalVacuumed,
    ];

    /// The Prometheus label value, the agent's spelling: `no_credit`, `source_overflow`, …
    pub const fn label(self) -> &'static str {
        match self {
            AgentDropReason::Unspecified => "unspecified",
            AgentDropReason::NoCredit => "no_credit",
            AgentDropReason::SendQueueFull => "send_queue_full",
            AgentDropReason::Oversize => "oversize",
            AgentDropReason::Invalid => "invalid",
            AgentDropReason::SourceOverflow => "source_overflow",
            AgentDropReason::NotConnected => "not_connected",
            AgentDropReason::TransportError => "transport_error",
            AgentDropReason::Shutdown => "shutdown",
            AgentDropReason::KmsgOverwritten => "kmsg_overwritten",
            AgentDropReason::JournalVacuumed => "journal_vacuumed",
        }
    }
}

/// Most entries of [`AgentCounters::sent`] plus [`AgentCounters::dropped`] in one message.
pub const MAX_AGENT_COUNTER_ENTRIES: usize = 1024;

/// Agent → collector, in [`Heartbeat`](super::Heartbeat)s: the agent's own counters, so the
/// collector can export them as its own series (`uctel_collector_agent_*`) on a path the
/// agent's drops cannot starve.
///
/// Every figure is **cumulative since the agent process started** (the values of the
/// agent's `uctel_agent_*_total` counters), not per epoch nor per connection: a
/// reconnect (new epoch, new session) does not restart them, a lost or late message only
/// delays them, and the collector turns them into monotonic counters of its own by adding
/// the increase since the last message with the same [`AgentCounters::counters_epoch`]. A
/// new `counters_epoch` (the agent restarted) means the figures count from zero again.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct AgentCounters {
    /// Random per agent process start (not per connection: the connection's epoch is
    /// [`Hello::epoch`](super::Hello::epoch)); the counters below count from zero when it changes.
    #[prost(uint64, tag = "1")]
    pub counters_epoch: u64,
    /// Per stream: frames and records posted to the transport.
    #[prost(message, repeated, tag = "2")]
    pub sent: Vec<AgentStreamSent>,
    /// Per stream and reason: frames and records dropped before posting. Entries at zero
    /// may be left out.
    #[prost(message, repeated, tag = "3")]
    pub dropped: Vec<AgentStreamDropped>,
}

/// One stream's posted frames and records ([`AgentCounters::sent`]), cumulative.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct AgentStreamSent {
    /// Stream id of the frame header.
    #[prost(uint32, tag = "1")]
    pub stream_id: u32,
    /// Frames posted.
    #[prost(uint64, tag = "2")]
    pub frames: u64,
    /// Records in the frames posted.
    #[prost(uint64, tag = "3")]
    pub records: u64,
}

/// One stream's drops for one reason ([`AgentCounters::dropped`]), cumulative.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct AgentStreamDropped {
    /// Stream id of the frame header.
    #[prost(uint32, tag = "1")]
    pub stream_id: u32,
    /// [`AgentDropReason`]; unknown values read as `Unspecified` through `reason()`.
    #[prost(enumeration = "AgentDropReason", tag = "2")]
    pub reason: i32,
    /// Frames dropped (0 for records dropped before they were framed).
    #[prost(uint64, tag = "3")]
    pub frames: u64,
    /// Records dropped.
    #[prost(uint64, tag = "4")]
    pub records: u64,
}

/// At most [`MAX_AGENT_COUNTER_ENTRIES`] entries in `counters` (unknown reasons are
/// accepted for forward compatibility and read as `Unspecified`).
pub(super) fn check_agent_counters(
    msg: &'static str,
    counters: Option<&AgentCounters>,
) -> Result<(), InvalidMessage> {
    let Some(c) = counters else {
        return Ok(());
    };
    let n = c.sent.len().saturating_add(c.dropped.len());
    if n > MAX_AGENT_COUNTER_ENTRIES {
        return Err(invalid(
            msg,
            "agent_counters",
            format!("{n} entries, more than {MAX_AGENT_COUNTER_ENTRIES}"),
        ));
    }
    Ok(())
}
