//! The live sessions as the status API shows them: one [`SessionView`] per connected
//! agent, put on the [`Board`] by the control plane when it sends the `Welcome` and taken
//! off when the session ends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// One agent's live session.
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The connection id the credit budget knows it by (`crate::credits::CreditBudget`).
    pub conn_id: u32,
    /// The agent's control-connection address.
    pub peer: SocketAddr,
    /// The host name the agent announced in its `Hello`.
    pub hostname: String,
    /// The epoch the agent announced (DESIGN.md §6).
    pub epoch: u64,
    /// `write_with_imm` or `send` (DESIGN.md §3).
    pub data_path: &'static str,
    /// The lanes of the session: `uc`, and `rc` when the agent asked for one (DESIGN.md §8b).
    pub lanes: Vec<&'static str>,
    /// The `Welcome` was sent then (wall clock, for the document).
    pub since: SystemTime,
    /// The `Welcome` was sent then (monotonic, for durations).
    pub since_instant: Instant,
}

/// The live sessions by agent id; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<BTreeMap<String, SessionView>>>);

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SessionView>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `agent`'s session was welcomed (a newer session of the id replaces the entry).
    pub fn connected(&self, agent: &str, view: SessionView) {
        self.lock().insert(agent.to_owned(), view);
    }

    /// `agent`'s session on connection `conn_id` ended (an entry of a newer connection of
    /// the id stays).
    pub fn ended(&self, agent: &str, conn_id: u32) {
        let mut board = self.lock();
        if board.get(agent).is_some_and(|v| v.conn_id == conn_id) {
            board.remove(agent);
        }
    }

    /// Every live session, by agent id.
    pub fn sessions(&self) -> BTreeMap<String, SessionView> {
        self.lock().clone()
    }
}

/// The status name of a data path (`DataPath` of the control protocol).
pub fn data_path_name(p: uctel_protocol::control::DataPath) -> &'static str {
    match p {
        uctel_protocol::control::DataPath::WriteWithImm => "write_with_imm",
        uctel_protocol::control::DataPath::Send => "send",
        uctel_protocol::control::DataPath::Unspecified => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(conn_id: u32) -> SessionView {
        SessionView {
            conn_id,
            peer: "127.0.0.1:1".parse().unwrap(),
            hostname: "h".into(),
            epoch: 7,
            data_path: "send",
            lanes: vec!["uc"],
            since: SystemTime::now(),
            since_instant: Instant::now(),
        }
    }

    #[test]
    fn a_newer_session_survives_the_end_of_the_one_it_replaced() {
        let b = Board::default();
        b.connected("a", view(1));
        b.connected("a", view(2));
        b.ended("a", 1);
        assert_eq!(b.sessions()["a"].conn_id, 2);
        b.ended("a", 2);
        assert!(b.sessions().is_empty());
    }
}
