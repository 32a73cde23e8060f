//! The Pair's credit words (DESIGN.md §4): the collector writes the agent's credit (its
//! consumed point and a grant of `credit_window` frames beyond it) as a
//! [`CreditWord`] over a reverse [`WordLink`] with seeded drop, duplicate and reorder (UC
//! on the way back), into the agent's memory, where the agent's [`WordFilter`] reads it as
//! the product does at each wake.

use std::time::Duration;

use uctel_agent::credits::{WordFilter, WordRead};
use uctel_protocol::control::{CreditWord, CREDIT_WORD_BYTES};

use super::{LinkFaults, LATENCY};
use crate::faults::Rng;

/// The reverse wire of the credit writes.
#[derive(Debug)]
pub struct WordLink {
    rng: Rng,
    faults: LinkFaults,
    in_flight: Vec<(Duration, u64, [u8; CREDIT_WORD_BYTES])>,
    order: u64,
    /// Words written.
    pub written: u64,
    /// Words the link dropped.
    pub dropped: u64,
    /// Extra copies put on the wire.
    pub duplicated: u64,
}

impl WordLink {
    fn chance(&mut self, per_mille: u32) -> bool {
        self.rng.range(0, 999) < u64::from(per_mille)
    }

    fn send(&mut self, word: &CreditWord, now: Duration) {
        self.written += 1;
        if self.chance(self.faults.drop) {
            self.dropped += 1;
            return;
        }
        let copies = if self.chance(self.faults.duplicate) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = now + LATENCY;
            if self.chance(self.faults.reorder) {
                at += Duration::from_micros(
                    self.rng
                        .range(1, u64::from(self.faults.max_delay_us.max(1))),
                );
            }
            self.order += 1;
            self.in_flight.push((at, self.order, word.encode()));
        }
    }

    /// The arrival time of the next word.
    pub(super) fn next_arrival(&self) -> Option<Duration> {
        self.in_flight.iter().map(|w| w.0).min()
    }

    fn pop_due(&mut self, now: Duration) -> Option<[u8; CREDIT_WORD_BYTES]> {
        let i = self
            .in_flight
            .iter()
            .enumerate()
            .filter(|(_, w)| w.0 <= now)
            .min_by_key(|(_, w)| (w.0, w.1))
            .map(|(i, _)| i)?;
        Some(self.in_flight.swap_remove(i).2)
    }
}

/// Both ends of the credit writes: the collector's writer, the wire, the agent's memory and
/// its reader.
#[derive(Debug)]
pub struct Words {
    /// The wire.
    pub link: WordLink,
    epoch: u64,
    window: u64,
    /// The grant written last (sequence, limit).
    grant: (u64, u64),
    /// The agent's credit word region.
    memory: [u8; CREDIT_WORD_BYTES],
    filter: WordFilter,
    /// The limit of the newest grant (by sequence) among the words the agent read: no frame
    /// it posts may carry a connection sequence at or beyond it.
    pub seen_limit: Option<u64>,
    seen_sequence: u64,
    /// Words the agent applied.
    pub applied: u64,
}

impl Words {
    /// The writes of a connection of `epoch` whose window is `window`, over a link with
    /// `faults` seeded by `seed`.
    pub fn new(seed: u64, faults: LinkFaults, epoch: u64, window: u64) -> Words {
        Words {
            link: WordLink {
                rng: Rng::new(seed ^ 0x00c0_ed17),
                faults,
                in_flight: Vec::new(),
                order: 0,
                written: 0,
                dropped: 0,
                duplicated: 0,
            },
            epoch,
            window,
            grant: (0, 0),
            memory: [0; CREDIT_WORD_BYTES],
            filter: WordFilter::new(epoch),
            seen_limit: None,
            seen_sequence: 0,
            applied: 0,
        }
    }

    /// The collector writes: consumed point `consumed_next`, limit `window` beyond it (a new
    /// grant sequence when the limit moved).
    pub fn write(&mut self, consumed_next: u64, now: Duration) {
        let limit = consumed_next.saturating_add(self.window);
        if limit != self.grant.1 || self.grant.0 == 0 {
            self.grant = (self.grant.0 + 1, limit);
        }
        let word = CreditWord {
            generation: self.epoch,
            grant_sequence: self.grant.0,
            grant_limit: self.grant.1,
            consumed_next,
        };
        self.link.send(&word, now);
    }

    /// Words due by `now` land in the agent's memory (the NIC's RDMA WRITE).
    pub fn land(&mut self, now: Duration) {
        while let Some(bytes) = self.link.pop_due(now) {
            self.memory = bytes;
        }
    }

    /// The agent reads its memory: a new word of its session, if any (its grant, when newer
    /// than any read before, is the limit the agent saw last).
    pub fn read(&mut self) -> Option<CreditWord> {
        match self.filter.take(&self.memory) {
            WordRead::New(w) => {
                if w.grant_sequence > self.seen_sequence {
                    self.seen_sequence = w.grant_sequence;
                    self.seen_limit = Some(w.grant_limit);
                }
                Some(w)
            }
            _ => None,
        }
    }
}
