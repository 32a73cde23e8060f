//! The series dictionary's acknowledgment (`crate::dict`), collector → agent.

/// Bit of [`super::Hello::features`] and [`super::Welcome::features`]: the series
/// dictionary (`kind = metrics_dict` frames and [`DictAck`] messages, `crate::dict`). An
/// agent sets it when it can send dictionary frames; a collector sets it in `Welcome` when
/// it takes them, and only then does the agent send them. A collector that does not know
/// the field leaves it 0, so an agent of this version keeps sending `kind = metrics` frames
/// to it; an agent that does not set it never gets a [`DictAck`].
pub const FEATURE_SERIES_DICTIONARY: u32 = 1;
/// Every feature bit this version knows.
pub const KNOWN_FEATURES: u32 = FEATURE_SERIES_DICTIONARY;

/// Collector → agent: the series dictionary of stream `stream_id` in epoch `epoch` holds
/// every id below `known_up_to` (a contiguous prefix of the ids the agent gave out). Sent
/// only when the number advanced, at most once per report interval; the agent then sends
/// those series' values without their definitions. An acknowledgment of another epoch is
/// ignored (its dictionary is gone).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct DictAck {
    /// The agent epoch whose dictionary this is.
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    /// The frame header's stream id.
    #[prost(uint32, tag = "2")]
    pub stream_id: u32,
    /// Every id below this is known.
    #[prost(uint32, tag = "3")]
    pub known_up_to: u32,
}
