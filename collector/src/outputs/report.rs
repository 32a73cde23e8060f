//! What an output's counters did, said in the log: a count, not only a rate on `/metrics`.
//!
//! Per endpoint, from its counters (never from the send path, so a line costs nothing per
//! item and a thousand shards still make one line):
//!
//! * **given up**: at most one line per reason every [`REPORT_EVERY`], with the items given
//!   up for that reason since its last line (`queue_full` while the receiver is down,
//!   `rejected`, …);
//! * **recovered**: when items are delivered again after a period in which requests were
//!   only retried, one line with how long it failed and how many items were retried;
//! * **stopped**: at shutdown, once the output has settled (nothing pending) or its grace
//!   period is over, one line with what was delivered since start, what was flushed after
//!   the stop, and what was given up in all, by reason.
//!
//! The rules are the sans-IO [`Reporter`] (counters and `now` in, lines out); [`run`]
//! drives it every second.

use std::time::{Duration, Instant};

use uctel_common::shutdown::Shutdown;

/// The shortest time between two lines of one reason.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// An output's counters at one instant (cumulative since start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Items the receiver accepted.
    pub delivered: u64,
    /// Items sent again after a failed request.
    pub retried: u64,
    /// Items waiting in the queue or in a request.
    pub pending: u64,
    /// Items given up, by reason label (every reason, in a fixed order).
    pub given_up: Vec<(&'static str, u64)>,
}

/// A line to log.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// `count` items given up for `reason` over the last `over`.
    GivenUp {
        /// The reason label.
        reason: &'static str,
        /// Items since the reason's previous line.
        count: u64,
        /// Since that line (or the start).
        over: Duration,
    },
    /// Deliveries resumed after `after` of failing requests, `retried` items retried.
    Recovered {
        /// How long requests failed.
        after: Duration,
        /// Items retried meanwhile.
        retried: u64,
    },
    /// The output stopped.
    Stopped {
        /// Items delivered since start.
        delivered: u64,
        /// Of those, delivered after the stop was asked for.
        flushed: u64,
        /// Items given up since start, by reason (reasons with none left out).
        given_up: Vec<(&'static str, u64)>,
        /// Items still pending when the grace period ended (counted given up by the output
        /// as it stops).
        pending: u64,
    },
}

/// The reporting rules of one endpoint; see the module documentation.
#[derive(Debug)]
pub struct Reporter {
    last: Tally,
    /// Per reason: when its last line went out, and the count then.
    reported: Vec<(Instant, u64)>,
    /// Requests failing since, and the retried count then.
    failing: Option<(Instant, u64)>,
    /// Delivered when the stop was asked for.
    delivered_at_stop: Option<u64>,
}

impl Reporter {
    /// Starts at `now` from `tally`.
    pub fn new(now: Instant, tally: Tally) -> Reporter {
        Reporter {
            reported: tally.given_up.iter().map(|(_, n)| (now, *n)).collect(),
            last: tally,
            failing: None,
            delivered_at_stop: None,
        }
    }

    /// The lines due at `now` with the counters `tally`.
    pub fn tick(&mut self, now: Instant, tally: Tally) -> Vec<Line> {
        let mut out = Vec::new();
        let delivered = tally.delivered > self.last.delivered;
        let retried = tally.retried > self.last.retried;
        match self.failing {
            None if retried && !delivered => self.failing = Some((now, self.last.retried)),
            Some((since, at)) if delivered => {
                out.push(Line::Recovered {
                    after: now.saturating_duration_since(since),
                    retried: tally.retried.saturating_sub(at),
                });
                self.failing = None;
            }
            _ => {}
        }
        for (i, (reason, n)) in tally.given_up.iter().enumerate() {
            if i >= self.reported.len() {
                self.reported.push((now, 0));
            }
            let (at, before) = self.reported[i];
            if *n > before && now.saturating_duration_since(at) >= REPORT_EVERY {
                out.push(Line::GivenUp {
                    reason,
                    count: n - before,
                    over: now.saturating_duration_since(at),
                });
                self.reported[i] = (now, *n);
            }
        }
        self.last = tally;
        out
    }

    /// The stop was asked for (counts what is delivered from now on as flushed).
    pub fn stopping(&mut self) {
        self.delivered_at_stop.get_or_insert(self.last.delivered);
    }

    /// The final line with the counters `tally`.
    pub fn stopped(&mut self, tally: Tally) -> Line {
        let at_stop = self.delivered_at_stop.unwrap_or(tally.delivered);
        Line::Stopped {
            delivered: tally.delivered,
            flushed: tally.delivered.saturating_sub(at_stop),
            given_up: tally
                .given_up
                .iter()
                .filter(|(_, n)| *n > 0)
                .copied()
                .collect(),
            pending: tally.pending,
        }
    }
}

/// Logs `line` of the output `what` (`remote-write`, `ClickHouse`) at `url`, whose items
/// are `items` (`samples`, `rows`).
pub fn log(what: &str, url: &str, items: &str, line: &Line) {
    match line {
        Line::GivenUp {
            reason,
            count,
            over,
        } => tracing::warn!(
            output = what,
            url,
            reason,
            count,
            "{what} output: {count} {items} given up ({reason}) in the last {:.0} s; counted in the output's dropped/failed counters",
            over.as_secs_f64()
        ),
        Line::Recovered { after, retried } => tracing::info!(
            output = what,
            url,
            retried,
            "{what} output recovered after {:.1} s of failing requests; {retried} {items} retried",
            after.as_secs_f64()
        ),
        Line::Stopped {
            delivered,
            flushed,
            given_up,
            pending,
        } => {
            let lost: Vec<String> = given_up.iter().map(|(r, n)| format!("{r} {n}")).collect();
            let lost = if lost.is_empty() {
                "none".to_owned()
            } else {
                lost.join(", ")
            };
            tracing::info!(
                output = what,
                url,
                delivered,
                flushed,
                pending,
                "{what} output stopped: {delivered} {items} delivered since start ({flushed} flushed after the stop), given up: {lost}"
            );
        }
    }
}

/// Reports the counters `read` returns every second until `shutdown`, then until nothing
/// is pending or `grace` (plus a second) has passed, and logs the final line. `url`: the
/// endpoint the lines name (the one in force at each line, where a reload may replace it).
pub async fn run(
    what: &'static str,
    url: impl Fn() -> String + Send,
    items: &'static str,
    read: impl Fn() -> Tally + Send,
    grace: Duration,
    mut shutdown: Shutdown,
) {
    let mut r = Reporter::new(Instant::now(), read());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop_by: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.wait(), if stop_by.is_none() => {
                r.stopping();
                stop_by = Some(tokio::time::Instant::now() + grace + Duration::from_secs(1));
            }
        }
        let tally = read();
        for line in r.tick(Instant::now(), tally.clone()) {
            log(what, &url(), items, &line);
        }
        if let Some(by) = stop_by {
            if tally.pending == 0 || tokio::time::Instant::now() >= by {
                log(what, &url(), items, &r.stopped(tally));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(delivered: u64, retried: u64, queue_full: u64) -> Tally {
        Tally {
            delivered,
            retried,
            pending: 0,
            given_up: vec![("queue_full", queue_full), ("rejected", 0)],
        }
    }

    #[test]
    fn drops_are_counted_in_one_line_per_reason_every_ten_seconds() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = Reporter::new(t0, tally(0, 0, 0));
        // A receiver down for 60 s: requests retried, the queue overflows every second.
        let mut lines = Vec::new();
        for i in 1..=60u64 {
            lines.extend(r.tick(t0 + s * i as u32, tally(0, 100 * i, 1000 * i)));
        }
        let given_up: Vec<u64> = lines
            .iter()
            .filter_map(|l| match l {
                Line::GivenUp { count, .. } => Some(*count),
                _ => None,
            })
            .collect();
        assert_eq!(
            given_up,
            vec![10_000; 6],
            "one line per 10 s, each with its count"
        );
        // Back: one recovered line, with the failing time and what was retried.
        let back = r.tick(t0 + s * 61, tally(500, 6100, 60_000));
        assert_eq!(
            back,
            vec![Line::Recovered {
                after: Duration::from_secs(60),
                retried: 6100
            }]
        );
        // Nothing new: nothing to say.
        assert!(r.tick(t0 + s * 75, tally(900, 6100, 60_000)).is_empty());
        r.stopping();
        let end = r.stopped(tally(1000, 6100, 60_000));
        assert_eq!(
            end,
            Line::Stopped {
                delivered: 1000,
                flushed: 100,
                given_up: vec![("queue_full", 60_000)],
                pending: 0
            }
        );
    }
}
