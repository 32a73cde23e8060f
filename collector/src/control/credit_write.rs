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

    /// Puts the current word with `consumed_next` into the next line of the source region
    /// and returns the write that carries it, for a batch ([`super::credit_batch`]). `None`
    /// when the source region refused the bytes (never, for a region of
    /// [`CREDIT_SOURCE_BYTES`]).
    pub(crate) fn prepare(&mut self, consumed_next: u64) -> Option<PendingWrite> {
        let slot = self.next;
        self.next = (self.next + 1) % SOURCE_WORDS;
        let offset = slot * STRIDE;
        self.session
            .credit_src
            .write_at(offset, &self.word(consumed_next).encode())
            .ok()?;
        Some(PendingWrite {
            session: self.session.clone(),
            offset,
            remote: self.remote,
            signaled: slot % SIGNAL_EVERY == SIGNAL_EVERY - 1,
        })
    }

    /// Posts one write of the current word with `consumed_next` on its own. False when the
    /// QP did not take it (its send queue full, the QP in ERROR): the next write supersedes
    /// it, so this is counted, never retried.
    pub(crate) fn write(&mut self, consumed_next: u64) -> bool {
        self.prepare(consumed_next)
            .is_some_and(|w| w.session.qp.post_send(&[w.wr()]).is_ok())
    }
}

/// One credit write whose word is in its source line, not yet posted.
#[derive(Debug)]
pub(crate) struct PendingWrite {
    /// The connection (its QP and source region).
    pub(crate) session: Arc<Session>,
    /// Where the word lies in `session.credit_src`.
    offset: usize,
    /// The agent's region.
    remote: CreditMr,
    /// `IBV_SEND_SIGNALED` ([`SIGNAL_EVERY`]).
    signaled: bool,
}

impl PendingWrite {
    /// The RDMA WRITE of the word into the agent's region (IBTA §9.4.3).
    pub(crate) fn wr(&self) -> SendWr<'_> {
        #[allow(clippy::cast_possible_truncation)]
        let sge = Sge::new(
            &self.session.credit_src,
            self.offset,
            CREDIT_WORD_BYTES as u32,
        );
        SendWr::write(
            CREDIT_WRITE_WR_ID,
            Some(sge),
            self.remote.addr,
            self.remote.rkey,
        )
        .with_signaled(self.signaled)
    }
}
