//! The probe of a collector pool (`agent::pool`): a connection whose only message is a
//! [`Probe`], answered by the collector process itself with a [`ProbeAnswer`], so a
//! collector whose kernel accepts connections while the process is stopped does not pass.

use super::RefuseReason;

/// Agent → collector, as the first and only message of a probe connection (an agent
/// connected elsewhere asking whether this collector's process is alive and would take it).
/// The collector answers one [`ProbeAnswer`] with the same nonce at once and closes. A
/// collector older than this message reads it as an envelope without a body and answers
/// `Refuse{protocol_error}`: an answer all the same, so the agent takes it as alive.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Probe {
    /// Random per probe; echoed in the [`ProbeAnswer`], so a stale or foreign answer does
    /// not count.
    #[prost(uint64, tag = "1")]
    pub nonce: u64,
}

/// Collector → agent: the answer to a [`Probe`]; the collector closes after sending it.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ProbeAnswer {
    /// The probe's nonce.
    #[prost(uint64, tag = "1")]
    pub nonce: u64,
    /// Whether a `Hello` now would be taken: false while draining or at `max_agents`.
    #[prost(bool, tag = "2")]
    pub accepting: bool,
    /// Why not, when not accepting ([`RefuseReason`] the `Hello` would get); `Unspecified`
    /// when accepting.
    #[prost(enumeration = "RefuseReason", tag = "3")]
    pub reason: i32,
}
