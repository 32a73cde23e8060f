//! Credits written into the agent's memory (DESIGN.md §4 "Credits", §6): the collector's
//! side. At `Hello` an agent that offers it names a small region of its memory
//! (`Hello.credit_mr`); the collector answers `Welcome.credit_writes` and from then on grants
//! credit with a UC RDMA WRITE of one [`CreditWord`] into that region, on the connection's
//! own QP: no immediate, so it consumes no receive WR at the agent and makes no completion
//! there (IBTA §9.4.3; rxe `rxe_responder.c` `write_data_in`), and the agent's CPU reads it
//! when it wants credit, with no system call and no message.
//!
//! The word is absolute (the grant's sequence and limit, the consumed point): idempotent,
//! the newest wins. The collector writes it at every report interval whether or not
//! anything changed (the refresh), and at once for an early report, so a lost write — UC
//! does not retransmit on the reverse path either — is superseded within one report
//! interval; a duplicated or late write carries a grant and consumed point the agent has
//! already passed and changes nothing. The safety of the budget does not depend on any write
//! arriving: a lowered limit still counts as taken back only once the agent's heartbeat says
//! it applied it (`crate::credits`), exactly as for a grant in a `Report`.

use std::sync::Arc;

use uctel_protocol::control::{CreditGrant, CreditMr, CreditWord, CREDIT_WORD_BYTES};
use uctel_transport::api::{SendWr, Sge};

use crate::dataplane::{Session, CREDIT_SOURCE_BYTES};

/// Bytes of one word's place in the source region (a cache line).
const STRIDE: usize = 64;

/// Words in the source region ([`CREDIT_SOURCE_BYTES`]), written in turn: a word being read
/// by the NIC for an earlier WR is never overwritten by the next one while fewer than this
/// many WRs are outstanding.
const SOURCE_WORDS: usize = CREDIT_SOURCE_BYTES / STRIDE;

/// One WR in this many is signaled: its completion frees the send queue slots of the
/// unsignaled ones before it (verbs; the soft QP frees each at once). With a send queue of
/// 16 and [`SOURCE_WORDS`] words, at most 8 writes wait for a completion.
const SIGNAL_EVERY: usize = 8;

/// `wr_id` of a credit write's completion (the worker drains the send CQ).
pub(crate) const CREDIT_WRITE_WR_ID: u64 = u64::MAX - 1;

/// Writes one connection's credit words; see the module documentation.
#[derive(Debug)]
pub(crate) struct CreditWriter {
    session: Arc<Session>,
    remote: CreditMr,
    generation: u64,
    latest: CreditGrant,
    next: usize,
}

impl CreditWriter {
    /// A writer into the agent's `remote` region for the session of the agent's `epoch`
    /// (the words' generation) over `session`'s QP, starting from the `Welcome`'s grant.
    /// `None` when the region cannot hold a word (`Hello` validation refuses that already).
    pub(crate) fn new(
        session: Arc<Session>,
        remote: CreditMr,
        epoch: u64,
        first: CreditGrant,
    ) -> Option<CreditWriter> {
        ((remote.length as usize) >= CREDIT_WORD_BYTES).then_some(CreditWriter {
            session,
            remote,
            generation: epoch,
            latest: first,
            next: 0,
        })
    }

    /// A new grant for the next words (older ones are ignored).
    pub(crate) fn grant(&mut self, grant: Option<CreditGrant>) {
        if let Some(g) = grant.filter(|g| g.sequence > self.latest.sequence) {
            self.latest = g;
        }
    }

    /// The word the next write carries, with `consumed_next` (one past the highest
    /// connection sequence consumed; 0: none yet).
    pub(crate) fn word(&self, consumed_next: u64) -> CreditWord {
        CreditWord {
            generation: self.generation,
            grant_sequence: self.latest.sequence,
            grant_limit: self.latest.limit,
            consumed_next,
        }
    }

    /// Posts one write of the current word with `consumed_next`. False when the QP did not
    /// take it (its send queue full, the QP in ERROR): the next write supersedes it, so
    /// this is counted, never retried.
    pub(crate) fn write(&mut self, consumed_next: u64) -> bool {
        let slot = self.next;
        self.next = (self.next + 1) % SOURCE_WORDS;
        let offset = slot * STRIDE;
        let src = &self.session.credit_src;
        if src
            .write_at(offset, &self.word(consumed_next).encode())
            .is_err()
        {
            return false;
        }
        #[allow(clippy::cast_possible_truncation)]
        let sge = Sge::new(src, offset, CREDIT_WORD_BYTES as u32);
        let wr = SendWr::write(
            CREDIT_WRITE_WR_ID,
            Some(sge),
            self.remote.addr,
            self.remote.rkey,
        )
        .with_signaled(slot % SIGNAL_EVERY == SIGNAL_EVERY - 1);
        self.session.qp.post_send(&[wr]).is_ok()
    }
}
