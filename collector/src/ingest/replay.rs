//! [`DeliveredLogs`]: the highest log `end_offset` each agent delivered per file in its
//! earlier epochs, so that log records an agent sends again after a restart are recognised
//! as replays (the `ingest` module documentation, "Replayed log records"). Shared by every
//! connection of the collector, bounded in agents and files.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uctel_protocol::payload;

/// Most files per agent whose delivered log offsets [`DeliveredLogs`] remembers (and a
/// connection tracks); past it the files updated longest ago are forgotten (their lines are
/// then not recognised as replays).
pub const MAX_REPLAY_FILES_PER_AGENT: usize = 4096;

/// Most agent ids [`DeliveredLogs`] remembers (the control plane's registry remembers as
/// many epochs); when full, the agent folded longest ago is forgotten.
pub const MAX_REPLAY_AGENTS: usize = 65_536;

/// Most files [`DeliveredLogs`] remembers over all agents (about 48 bytes each); when
/// exceeded, the agents folded longest ago are forgotten.
pub const MAX_REPLAY_FILES: usize = 1 << 20;

/// The highest log `end_offset` delivered per agent id and `file_id` in the agent's ended
/// connections (earlier epochs), shared by every connection of the collector (see the
/// `ingest` module documentation, "Replayed log records"). Cheap to clone (one `Arc`).
#[derive(Clone, Debug, Default)]
pub struct DeliveredLogs {
    inner: Arc<Mutex<DeliveredInner>>,
}

#[derive(Debug, Default)]
struct DeliveredInner {
    agents: HashMap<String, AgentFiles>,
    files: usize,
    tick: u64,
}

#[derive(Debug, Default)]
struct AgentFiles {
    /// `file_id` → highest end offset delivered, the epoch that delivered it, when updated.
    files: HashMap<u64, FileMark>,
    /// When last folded into.
    tick: u64,
}

#[derive(Clone, Copy, Debug)]
struct FileMark {
    end_offset: u64,
    epoch: u64,
    tick: u64,
}

impl DeliveredLogs {
    fn lock(&self) -> std::sync::MutexGuard<'_, DeliveredInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Removes from `records` those `agent` already delivered in an epoch other than
    /// `epoch` (a `file_id` ≠ 0 and an `end_offset` at or below that epoch's highest);
    /// returns how many.
    pub(super) fn discard_replays(
        &self,
        agent: &str,
        epoch: u64,
        records: &mut Vec<payload::LogRecord>,
    ) -> u64 {
        if records.iter().all(|r| r.file_id == 0) {
            return 0;
        }
        let inner = self.lock();
        let Some(files) = inner.agents.get(agent) else {
            return 0;
        };
        let before = records.len();
        records.retain(|r| {
            r.file_id == 0
                || files
                    .files
                    .get(&r.file_id)
                    .is_none_or(|m| m.epoch == epoch || r.end_offset > m.end_offset)
        });
        (before - records.len()) as u64
    }

    /// Folds the highest end offsets one connection of `agent` in `epoch` delivered
    /// (`file_id` → offset) into what its later epochs compare with.
    pub(super) fn fold(&self, agent: &str, epoch: u64, highs: &HashMap<u64, u64>) {
        if highs.is_empty() {
            return;
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.tick += 1;
        let tick = inner.tick;
        if !inner.agents.contains_key(agent) && inner.agents.len() >= MAX_REPLAY_AGENTS {
            inner.forget_oldest_agent();
        }
        let a = inner.agents.entry(agent.to_owned()).or_default();
        let had = a.files.len();
        a.tick = tick;
        for (&file_id, &end_offset) in highs {
            let m = a.files.entry(file_id).or_insert(FileMark {
                end_offset,
                epoch,
                tick,
            });
            if end_offset >= m.end_offset {
                *m = FileMark {
                    end_offset,
                    epoch,
                    tick,
                };
            }
        }
        if a.files.len() > MAX_REPLAY_FILES_PER_AGENT {
            let mut ticks: Vec<u64> = a.files.values().map(|m| m.tick).collect();
            ticks.sort_unstable();
            let excess = a.files.len() - MAX_REPLAY_FILES_PER_AGENT;
            let cut = ticks.get(excess).copied().unwrap_or(u64::MAX);
            a.files.retain(|_, m| m.tick >= cut);
            // Ties at the cut: drop arbitrary ones of them down to the bound.
            let over = a.files.len().saturating_sub(MAX_REPLAY_FILES_PER_AGENT);
            let drop: Vec<u64> = a
                .files
                .iter()
                .filter(|(_, m)| m.tick == cut)
                .map(|(id, _)| *id)
                .take(over)
                .collect();
            for id in drop {
                a.files.remove(&id);
            }
        }
        let now = a.files.len();
        inner.files = inner.files.saturating_sub(had).saturating_add(now);
        while inner.files > MAX_REPLAY_FILES && inner.agents.len() > 1 {
            inner.forget_oldest_agent();
        }
    }

    /// Files remembered for `agent` (tests).
    pub fn files_of(&self, agent: &str) -> usize {
        self.lock().agents.get(agent).map_or(0, |a| a.files.len())
    }
}

impl DeliveredInner {
    fn forget_oldest_agent(&mut self) {
        let oldest = self
            .agents
            .iter()
            .min_by_key(|(_, a)| a.tick)
            .map(|(id, _)| id.clone());
        if let Some(a) = oldest.and_then(|id| self.agents.remove(&id)) {
            self.files = self.files.saturating_sub(a.files.len());
        }
    }
}
