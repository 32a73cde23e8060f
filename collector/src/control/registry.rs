//! Live sessions by agent id and the last epoch of each agent id.
//!
//! While a connection of an agent id is alive (heard from within the last one and a half
//! heartbeat intervals), a second connection with that id is refused with
//! `duplicate_agent_id` ([`Registry::admit`]); a silent one is replaced ([`replace`]): the
//! agent restarted while its old TCP connection was still open. A new epoch of a remembered
//! agent id counts as a reset ([`Registry::swap_epoch`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uctel_common::shutdown::ShutdownTrigger;

use super::cadence::ReportClock;
use crate::telemetry::Telemetry;

/// At most one warning about connections of one agent id replacing each other per this
/// period (`connections_replaced_total` counts every replacement).
pub const REPLACED_WARN_EVERY: Duration = Duration::from_secs(60);

/// Most agent ids the replacement-warning limiter remembers; when full, entries older than
/// [`REPLACED_WARN_EVERY`] are forgotten, and if it is still full the warning is skipped.
const REPLACED_WARN_ENTRIES: usize = 4096;

/// Most agent ids whose last epoch the collector remembers ([`Registry::swap_epoch`]). Ids
/// are only remembered after a successful handshake, but a shared token admits any id, so
/// the table is bounded: when full, the id remembered longest ago is forgotten (its next
/// connection then counts no `epoch_change` reset). The same bound as the log replay
/// table's ([`crate::ingest::MAX_REPLAY_AGENTS`]).
pub const MAX_REMEMBERED_EPOCHS: usize = crate::ingest::MAX_REPLAY_AGENTS;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One live session in the [`Registry`].
#[derive(Debug)]
pub(super) struct LiveSession {
    /// Registry id (tells a session from its successor).
    id: u64,
    /// Ends the session.
    trigger: ShutdownTrigger,
    /// Set when the session ended.
    done: tokio::sync::watch::Receiver<bool>,
    /// The agent's control-connection address.
    peer: SocketAddr,
    /// The epoch the agent announced.
    epoch: u64,
    /// Shared with the session task.
    link: Arc<SessionLink>,
}

/// What a session shares with the connection that may replace it.
#[derive(Debug)]
pub(super) struct SessionLink {
    /// When the agent last sent a control message (heartbeats at least every heartbeat
    /// interval); the session starts it at the `Welcome`.
    last_heard: Mutex<Instant>,
    /// Why a newer connection of the same agent id ended this one: the `Goodbye` detail.
    replaced_by: Mutex<Option<String>>,
    /// The session is ending (the agent said `Goodbye`, its connection closed, or the
    /// collector ended it): a new connection of the id is the agent coming back, not a twin.
    ending: AtomicBool,
}

impl SessionLink {
    /// A link whose agent counts as heard at `now`.
    pub(super) fn new(now: Instant) -> SessionLink {
        SessionLink {
            last_heard: Mutex::new(now),
            replaced_by: Mutex::new(None),
            ending: AtomicBool::new(false),
        }
    }

    pub(super) fn set_ending(&self) {
        self.ending.store(true, Ordering::Release);
    }

    fn is_ending(&self) -> bool {
        self.ending.load(Ordering::Acquire)
    }

    /// The agent sent a control message at `now` (an earlier `now` than the last one
    /// changes nothing).
    pub(super) fn heard_at(&self, now: Instant) {
        let mut last = lock(&self.last_heard);
        *last = (*last).max(now);
    }

    /// How long the agent has been silent at `now`.
    fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*lock(&self.last_heard))
    }

    /// Why a newer connection replaced this one, once.
    pub(super) fn take_replaced_by(&self) -> Option<String> {
        lock(&self.replaced_by).take()
    }
}

/// What [`Registry::admit`] decided.
#[derive(Debug)]
pub(super) enum Admission {
    /// Registered under `id`; `previous` is the session of the agent id it displaced.
    Admitted {
        id: u64,
        previous: Option<LiveSession>,
    },
    /// A live session of the agent id exists: refused.
    Alive {
        peer: SocketAddr,
        epoch: u64,
        silent_for: Duration,
    },
}

/// Live sessions by agent id, so a reconnecting agent replaces its stale session; and the
/// last epoch of each agent id, so a new epoch is counted as a reset.
#[derive(Debug, Default)]
pub struct Registry {
    live: Mutex<HashMap<String, LiveSession>>,
    next: AtomicU64,
    /// Agent id → (last epoch, stamp of the connection that announced it).
    epochs: Mutex<HashMap<String, (u64, u64)>>,
    /// Agent id → when a replacement of a live connection was last logged.
    replaced_warned: Mutex<HashMap<String, Instant>>,
    /// The grid that sessions' report ticks are laid on.
    pub(super) reports: ReportClock,
    /// The round of credit writes being gathered (batched across agents).
    pub(super) credit_batch: Arc<super::credit_batch::CreditBatch>,
}

impl Registry {
    /// True when a warning about `agent`'s connections replacing each other may be logged now
    /// (at most once per [`REPLACED_WARN_EVERY`] per agent id).
    pub(super) fn should_warn_replaced(&self, agent: &str) -> bool {
        let now = Instant::now();
        let mut warned = lock(&self.replaced_warned);
        if let Some(last) = warned.get_mut(agent) {
            if now.duration_since(*last) < REPLACED_WARN_EVERY {
                return false;
            }
            *last = now;
            return true;
        }
        if warned.len() >= REPLACED_WARN_ENTRIES {
            warned.retain(|_, last| now.duration_since(*last) < REPLACED_WARN_EVERY);
            if warned.len() >= REPLACED_WARN_ENTRIES {
                return false;
            }
        }
        warned.insert(agent.to_owned(), now);
        true
    }

    /// Records `epoch` as `agent`'s latest and returns the epoch it had before, `None` for
    /// an agent id not remembered (new, or forgotten past [`MAX_REMEMBERED_EPOCHS`]).
    pub fn swap_epoch(&self, agent: &str, epoch: u64) -> Option<u64> {
        let stamp = self.next.fetch_add(1, Ordering::Relaxed);
        let mut epochs = lock(&self.epochs);
        if let Some(e) = epochs.get_mut(agent) {
            let previous = e.0;
            *e = (epoch, stamp);
            return Some(previous);
        }
        if epochs.len() >= MAX_REMEMBERED_EPOCHS {
            let oldest = epochs
                .iter()
                .min_by_key(|(_, (_, s))| *s)
                .map(|(a, _)| a.clone());
            if let Some(oldest) = oldest {
                epochs.remove(&oldest);
            }
        }
        epochs.insert(agent.to_owned(), (epoch, stamp));
        None
    }

    /// Registers the authenticated connection of `agent` from `peer` in `epoch`, unless a
    /// session of that id is alive (not ending, heard within `alive_within`): an agent id
    /// with a live session keeps it, a second agent with that id is refused. A silent
    /// session is displaced (an agent restart racing its old connection) and returned for
    /// [`replace`]. `now`: when the connection asks.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &self,
        agent: &str,
        peer: SocketAddr,
        epoch: u64,
        alive_within: Duration,
        trigger: ShutdownTrigger,
        done: tokio::sync::watch::Receiver<bool>,
        link: Arc<SessionLink>,
        now: Instant,
    ) -> Admission {
        let mut live = lock(&self.live);
        match live.get(agent) {
            Some(existing)
                if !existing.link.is_ending() && existing.link.silent_for(now) <= alive_within =>
            {
                Admission::Alive {
                    peer: existing.peer,
                    epoch: existing.epoch,
                    silent_for: existing.link.silent_for(now),
                }
            }
            _ => {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                let mine = LiveSession {
                    id,
                    trigger,
                    done,
                    peer,
                    epoch,
                    link,
                };
                Admission::Admitted {
                    id,
                    previous: live.insert(agent.to_owned(), mine),
                }
            }
        }
    }

    /// Forgets `agent`'s session `id` (not a successor that replaced it).
    /// Agents with a live session.
    pub(super) fn live(&self) -> usize {
        lock(&self.live).len()
    }

    /// Whether `agent` has a live session (a new connection of it replaces, not adds).
    pub(super) fn is_live(&self, agent: &str) -> bool {
        lock(&self.live).contains_key(agent)
    }

    pub(super) fn remove(&self, agent: &str, id: u64) {
        let mut live = lock(&self.live);
        if live.get(agent).is_some_and(|s| s.id == id) {
            live.remove(agent);
        }
    }
}

/// A new connection of `agent` from `peer` in `epoch` ends the agent's `previous` session
/// and waits (bounded) for it to finish. A session that is already ending is only waited
/// for: its accounting is settled first, nothing is replaced. A previous connection heard
/// from within the last `heartbeat` interval counts as
/// `connections_replaced_total{previous="alive"}`, a race that the refusal rule
/// ([`Registry::admit`]) leaves only for a session that turned silent for a moment. `now`:
/// when the new connection was admitted.
#[allow(clippy::too_many_arguments)]
pub(super) async fn replace(
    registry: &Registry,
    telemetry: &Telemetry,
    heartbeat: Duration,
    agent: &str,
    peer: SocketAddr,
    epoch: u64,
    mut previous: LiveSession,
    now: Instant,
) {
    if previous.link.is_ending() {
        let _ = tokio::time::timeout(Duration::from_secs(5), previous.done.wait_for(|d| *d)).await;
        return;
    }
    let silent_for = previous.link.silent_for(now);
    let alive = silent_for <= heartbeat;
    telemetry.connection_replaced(agent, alive);
    let detail = if alive {
        format!(
            "replaced by a new connection with the same agent_id {agent:?} from {peer} \
             (epoch {epoch:#x}) while this connection was alive: if that is not this agent \
             restarting, two agents share agent_id {agent:?}; give each agent its own agent_id"
        )
    } else {
        format!(
            "replaced by a newer connection of this agent_id from {peer} (epoch {epoch:#x}); \
             this connection was silent for {silent_for:.1?}"
        )
    };
    *lock(&previous.link.replaced_by) = Some(detail);
    if !alive {
        tracing::info!(
            agent,
            peer = %peer,
            previous_peer = %previous.peer,
            silent_for = ?silent_for,
            "agent reconnected; replacing its previous, silent connection"
        );
    } else if registry.should_warn_replaced(agent) {
        tracing::warn!(
            agent,
            peer = %peer,
            epoch = format_args!("{epoch:#x}"),
            previous_peer = %previous.peer,
            previous_epoch = format_args!("{:#x}", previous.epoch),
            previous_silent_for = ?silent_for,
            "connection from {peer} replaced a still-alive connection of agent_id {agent:?} \
             from {}: two agents share agent_id? (each replacement is counted in \
             uctel_collector_connections_replaced_total; this warning repeats at most once a \
             minute per agent)",
            previous.peer
        );
    }
    previous.trigger.trigger();
    let _ = tokio::time::timeout(Duration::from_secs(5), previous.done.wait_for(|d| *d)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_remembered_per_agent_and_bounded() {
        let r = Registry::default();
        assert_eq!(r.swap_epoch("a", 1), None);
        assert_eq!(r.swap_epoch("a", 2), Some(1));
        assert_eq!(r.swap_epoch("b", 7), None);
        assert_eq!(r.swap_epoch("a", 3), Some(2));
        for i in 0..MAX_REMEMBERED_EPOCHS {
            let _ = r.swap_epoch(&format!("id-{i}"), 9);
        }
        assert_eq!(lock(&r.epochs).len(), MAX_REMEMBERED_EPOCHS);
        // "a" and "b" were remembered longest ago: forgotten first.
        assert_eq!(r.swap_epoch("b", 8), None);
        assert_eq!(r.swap_epoch("id-100", 10), Some(9));
    }

    #[test]
    fn a_live_session_keeps_its_id_and_a_silent_or_ending_one_is_displaced() {
        let r = Registry::default();
        let peer = SocketAddr::from(([10, 0, 0, 1], 1));
        let t0 = Instant::now();
        let admit = |link: &Arc<SessionLink>, within: Duration, now: Instant| {
            let (trigger, _) = uctel_common::shutdown::channel();
            let (_, done) = tokio::sync::watch::channel(false);
            r.admit("a", peer, 1, within, trigger, done, link.clone(), now)
        };
        let first = Arc::new(SessionLink::new(t0));
        let Admission::Admitted { id, previous: None } = admit(&first, Duration::from_secs(5), t0)
        else {
            panic!("the first connection was not admitted")
        };
        assert!(matches!(
            admit(&Arc::new(SessionLink::new(t0)), Duration::from_secs(5), t0),
            Admission::Alive { epoch: 1, .. }
        ));
        // Silent for longer than `alive_within` (zero here): displaced.
        let later = t0 + Duration::from_millis(2);
        let second = Arc::new(SessionLink::new(later));
        let Admission::Admitted {
            id: id2,
            previous: Some(p),
        } = admit(&second, Duration::ZERO, later)
        else {
            panic!("the silent session was not displaced")
        };
        assert_eq!(p.id, id);
        // An ending session is displaced even when just heard.
        second.set_ending();
        second.heard_at(later);
        assert!(matches!(
            admit(
                &Arc::new(SessionLink::new(later)),
                Duration::from_secs(5),
                later
            ),
            Admission::Admitted {
                previous: Some(_),
                ..
            }
        ));
        // Removing a displaced id leaves its successor.
        r.remove("a", id2);
        assert!(lock(&r.live).contains_key("a"));
    }
}
