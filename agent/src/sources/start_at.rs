//! [`StartAt`]: where a log source's very first run starts (`sources.logs[].start_at`,
//! `sources.journald.start_at`, `sources.kmsg.start_at`); a leaf module the sources and
//! their sections share.

use serde::{Deserialize, Serialize};

/// Where a log file found at the first scan of the first run (no checkpoint yet) is read
/// from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    /// Only lines written after the agent found the file (like `tail -F`). Default.
    #[default]
    End,
    /// The whole file.
    Beginning,
}
