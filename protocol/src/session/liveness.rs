//! Liveness of an established control connection: when to send a heartbeat, and when the
//! peer is dead.
//!
//! # The dead-peer rule
//!
//! A peer is dead once nothing at all (a heartbeat, a report, any message) has been heard
//! from it for
//!
//! ```text
//! dead_after = max(missed × heartbeat, at_least)
//! ```
//!
//! where `heartbeat` is the period the collector announces in `Welcome` (both sides
//! heartbeat at it), `missed` the heartbeat periods of silence tolerated and `at_least` a
//! floor on the silence. DESIGN.md §6 asks for one dead-peer rule shared by both daemons
//! but names no formula, so this is the one that keeps what each daemon did with its own
//! configuration keys:
//!
//! | daemon | `missed` | `at_least` | default (`heartbeat` 5 s) |
//! |---|---|---|---|
//! | collector | `control.dead_after_missed_heartbeats` (default 3) | 0 | 15 s |
//! | agent | 3 | `collector.heartbeat_timeout_seconds` (default 15) | 15 s |
//!
//! The rule is checked at its deadline: [`Liveness::poll_timeout`] names the earlier of the
//! next heartbeat and `last heard + dead_after`, and [`Liveness::handle_timeout`] declares
//! the peer dead when the silence has reached `dead_after` (`>=`: a driver that sleeps
//! exactly until the deadline sees it fire).
//!
//! # Heartbeats
//!
//! The first heartbeat is due at once (each side announces itself right after `Welcome`),
//! then one heartbeat period after the previous one was due. A driver late by more than a
//! period sends one heartbeat, not a burst, and the next is due a period after that one
//! (as tokio's `MissedTickBehavior::Delay`, which the daemons' intervals used). Heartbeats
//! are numbered from 1.
//!
//! Sans-IO: no clock and no socket; the driver passes `now` in and pulls the next deadline.

use std::time::{Duration, Instant};

/// The two durations of the dead-peer rule (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Period between heartbeats (at least 1 ns; a zero period is read as 1 ns).
    pub heartbeat: Duration,
    /// Silence after which the peer is dead.
    pub dead_after: Duration,
}

impl LivenessConfig {
    /// The dead-peer rule: dead after `max(missed × heartbeat, at_least)` of silence;
    /// `missed` is at least 1.
    pub fn new(heartbeat: Duration, missed: u32, at_least: Duration) -> LivenessConfig {
        let heartbeat = heartbeat.max(Duration::from_nanos(1));
        LivenessConfig {
            heartbeat,
            dead_after: heartbeat.saturating_mul(missed.max(1)).max(at_least),
        }
    }
}

/// What [`Liveness::handle_timeout`] asks the driver to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LivenessEvent {
    /// Send heartbeat number `sequence` (1, 2, …) now.
    SendHeartbeat {
        /// This heartbeat's number.
        sequence: u64,
    },
    /// Nothing was heard from the peer for `silent_for` (at least `dead_after`): end the
    /// connection. Reported once; the machine then has no deadline.
    PeerDead {
        /// Time since the peer was last heard.
        silent_for: Duration,
    },
}

/// The liveness state machine of one connection.
#[derive(Debug, Clone)]
pub struct Liveness {
    config: LivenessConfig,
    last_heard: Instant,
    next_heartbeat: Instant,
    sequence: u64,
    dead: bool,
}

impl Liveness {
    /// A connection established at `now` (the peer counts as heard at `now`); the first
    /// heartbeat is due at `now`.
    pub fn new(config: LivenessConfig, now: Instant) -> Liveness {
        Liveness {
            config,
            last_heard: now,
            next_heartbeat: now,
            sequence: 0,
            dead: false,
        }
    }

    /// The rule's durations.
    pub fn config(&self) -> LivenessConfig {
        self.config
    }

    /// Silence after which the peer is dead.
    pub fn dead_after(&self) -> Duration {
        self.config.dead_after
    }

    /// Anything arrived from the peer at `now`.
    pub fn on_receive(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// When the peer was last heard.
    pub fn last_heard(&self) -> Instant {
        self.last_heard
    }

    /// The next deadline: the next heartbeat or the dead-peer deadline, whichever is first;
    /// `None` once the peer was declared dead.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.dead {
            return None;
        }
        Some(self.next_heartbeat.min(self.dead_at()))
    }

    /// Runs the timers at `now`: the peer dead (checked first: a dead peer gets no more
    /// heartbeats), else a heartbeat due, else nothing (woken early).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<LivenessEvent> {
        if self.dead {
            return None;
        }
        if now >= self.dead_at() {
            self.dead = true;
            return Some(LivenessEvent::PeerDead {
                silent_for: now.saturating_duration_since(self.last_heard),
            });
        }
        if now >= self.next_heartbeat {
            let on_time = self.next_heartbeat + self.config.heartbeat;
            self.next_heartbeat = if on_time > now {
                on_time
            } else {
                now + self.config.heartbeat
            };
            self.sequence += 1;
            return Some(LivenessEvent::SendHeartbeat {
                sequence: self.sequence,
            });
        }
        None
    }

    fn dead_at(&self) -> Instant {
        self.last_heard + self.config.dead_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_secs(5);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Drives `l` from `start` until `end` the way a daemon does (sleep until the deadline,
    /// handle it), feeding `heard` as receptions; returns the events with their times.
    /// Bounded: a machine that never advances fails instead of hanging.
    fn drive(
        l: &mut Liveness,
        start: Instant,
        end: Instant,
        heard: &[Duration],
    ) -> Vec<(Duration, LivenessEvent)> {
        let mut heard: Vec<Instant> = heard.iter().map(|d| start + *d).collect();
        heard.reverse();
        let mut out = Vec::new();
        for _ in 0..10_000 {
            let Some(deadline) = l.poll_timeout() else {
                return out;
            };
            match heard.last() {
                Some(&h) if h <= deadline => {
                    l.on_receive(h);
                    heard.pop();
                    continue;
                }
                _ => {}
            }
            if deadline > end {
                return out;
            }
            if let Some(e) = l.handle_timeout(deadline) {
                out.push((deadline - start, e));
            }
        }
        panic!("the drive loop did not end: {out:?}");
    }

    #[test]
    fn the_rule_keeps_both_daemons_defaults() {
        // Collector: 3 missed heartbeats of 5 s, no floor.
        assert_eq!(
            LivenessConfig::new(HB, 3, Duration::ZERO).dead_after,
            Duration::from_secs(15)
        );
        // Agent: 3 heartbeats, at least heartbeat_timeout_seconds (15).
        assert_eq!(
            LivenessConfig::new(HB, 3, Duration::from_secs(15)).dead_after,
            Duration::from_secs(15)
        );
        // The floor wins over short heartbeats, the heartbeats over a short floor.
        assert_eq!(LivenessConfig::new(ms(10), 3, ms(200)).dead_after, ms(200));
        assert_eq!(LivenessConfig::new(HB, 3, ms(200)).dead_after, HB * 3);
        // `missed` 0 reads as 1; a zero period does not stall the machine.
        assert_eq!(LivenessConfig::new(HB, 0, Duration::ZERO).dead_after, HB);
        assert!(LivenessConfig::new(Duration::ZERO, 3, Duration::ZERO).heartbeat > Duration::ZERO);
    }

    #[test]
    fn heartbeats_start_at_once_and_follow_the_period() {
        let t0 = Instant::now();
        let mut l = Liveness::new(LivenessConfig::new(HB, 3, Duration::ZERO), t0);
        assert_eq!(l.poll_timeout(), Some(t0));
        // The peer answers every 5 s: never dead, a heartbeat every period.
        let heard: Vec<Duration> = (1..=20).map(|i| HB * i - ms(1)).collect();
        let events = drive(&mut l, t0, t0 + Duration::from_secs(60), &heard);
        let beats: Vec<(Duration, u64)> = events
            .iter()
            .map(|(at, e)| match e {
                LivenessEvent::SendHeartbeat { sequence } => (*at, *sequence),
                LivenessEvent::PeerDead { .. } => panic!("declared dead: {events:?}"),
            })
            .collect();
        let want: Vec<(Duration, u64)> = (0..=12).map(|i| (HB * i, u64::from(i) + 1)).collect();
        assert_eq!(beats, want);
    }

    #[test]
    fn a_silent_peer_is_dead_at_the_deadline_and_not_before() {
        let t0 = Instant::now();
        let mut l = Liveness::new(LivenessConfig::new(HB, 3, Duration::ZERO), t0);
        assert_eq!(
            l.handle_timeout(t0),
            Some(LivenessEvent::SendHeartbeat { sequence: 1 })
        );
        l.on_receive(t0 + ms(2_000));
        let dead_at = t0 + ms(17_000);
        // Heartbeats at 5, 10 and 15 s; then the dead-peer deadline comes first.
        for (i, at) in [5u64, 10, 15].into_iter().enumerate() {
            assert_eq!(l.poll_timeout(), Some(t0 + Duration::from_secs(at)));
            assert_eq!(
                l.handle_timeout(t0 + Duration::from_secs(at)),
                Some(LivenessEvent::SendHeartbeat {
                    sequence: i as u64 + 2
                })
            );
        }
        assert_eq!(l.poll_timeout(), Some(dead_at));
        assert_eq!(l.handle_timeout(dead_at - Duration::from_nanos(1)), None);
        assert_eq!(
            l.handle_timeout(dead_at),
            Some(LivenessEvent::PeerDead {
                silent_for: Duration::from_secs(15)
            })
        );
        // Reported once; no deadline, no heartbeat after.
        assert_eq!(l.poll_timeout(), None);
        assert_eq!(l.handle_timeout(dead_at + HB * 10), None);
    }

    #[test]
    fn anything_heard_postpones_the_deadline() {
        let t0 = Instant::now();
        let mut l = Liveness::new(LivenessConfig::new(ms(10), 3, ms(200)), t0);
        let heard = [ms(150), ms(300)];
        let events = drive(&mut l, t0, t0 + Duration::from_secs(5), &heard);
        let dead: Vec<_> = events
            .iter()
            .filter(|(_, e)| matches!(e, LivenessEvent::PeerDead { .. }))
            .collect();
        assert_eq!(
            dead,
            [&(
                ms(500),
                LivenessEvent::PeerDead {
                    silent_for: ms(200)
                }
            )]
        );
        // Heartbeats every 10 ms until then: 0, 10, …, 490.
        assert_eq!(events.len(), 50 + 1);
        // A reception older than the last one does not move the deadline back.
        let mut l = Liveness::new(LivenessConfig::new(HB, 3, Duration::ZERO), t0);
        l.on_receive(t0 + HB);
        l.on_receive(t0);
        assert_eq!(l.last_heard(), t0 + HB);
    }

    #[test]
    fn a_late_driver_sends_one_heartbeat_not_a_burst() {
        let t0 = Instant::now();
        let mut l = Liveness::new(LivenessConfig::new(HB, 100, Duration::ZERO), t0);
        assert!(l.handle_timeout(t0).is_some());
        // Woken early: nothing.
        assert_eq!(l.handle_timeout(t0 + ms(1)), None);
        // 23 s late: one heartbeat, the next one a period later.
        let late = t0 + ms(28_000);
        assert_eq!(
            l.handle_timeout(late),
            Some(LivenessEvent::SendHeartbeat { sequence: 2 })
        );
        assert_eq!(l.handle_timeout(late), None);
        assert_eq!(l.poll_timeout(), Some(late + HB));
    }
}
