//! Credit writes batched across agents (DESIGN.md §4 "Credits", §6): the round.
//!
//! The sessions of one report group tick at one instant ([`super::cadence`]), each in its own
//! task, and each has a credit word to write ([`super::credit_write`]). Posted one by one,
//! every write costs a transmit pass of the device and, on the soft transport, one
//! `sendmmsg(2)`. Here a session hands its write to the collector's [`CreditBatch`]; the
//! first write of a round schedules the round's flush [`FLUSH_DELAY`] later, and the flush
//! posts every write that came in meanwhile with one
//! [`post_send_batch`](uctel_transport::api::post_send_batch) per at most [`MAX_BATCH`]
//! writes: on the soft transport one transmit pass and one `sendmmsg` per link batch
//! (`transport.soft.batch`) for all of them, on verbs one `ibv_post_send` per QP (a WR list
//! belongs to one QP, so across agents verbs saves no doorbell; it saves the round's
//! wake-ups only).
//!
//! Latest wins inside a round as on the wire: a session's second write before the flush
//! replaces its first (the word is absolute, the newer one carries everything the older one
//! did), and only the write handed to the QP counts in
//! `uctel_collector_credit_writes_total`. An early write (an agent out of credit) joins the
//! next flush like any other: it leaves at most [`FLUSH_DELAY`] plus the runtime timer's
//! granularity (1 ms) after it was due, against the half report interval that made it
//! early. Each flush is one `uctel_collector_credit_write_batches_total`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use uctel_transport::api::{post_send_batch, QpSendList, SendWr};

use super::credit_write::PendingWrite;
use crate::credits::CreditBudget;

/// How long the first write of a round waits for the others: the sessions of a report group
/// woken at one instant all run within it on a loaded runtime.
pub(crate) const FLUSH_DELAY: Duration = Duration::from_millis(1);

/// Most writes in one transport call; a larger round takes several.
pub(crate) const MAX_BATCH: usize = 256;

/// The writes of the round being gathered.
#[derive(Debug, Default)]
struct Round {
    writes: Vec<PendingWrite>,
    /// Session id → index in `writes` (latest wins).
    by_session: HashMap<u32, usize>,
    /// A flush is scheduled for this round.
    scheduled: bool,
}

/// The collector's credit writes of the current round; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct CreditBatch {
    round: Mutex<Round>,
}

impl CreditBatch {
    /// Adds `write` to the current round (replacing the session's earlier one of the round)
    /// and schedules the round's flush on the Tokio runtime if none is; the flush counts
    /// each write in `credits`.
    pub(crate) fn submit(self: &Arc<Self>, write: PendingWrite, credits: &Arc<CreditBudget>) {
        let schedule = {
            let mut r = self.lock();
            let id = write.session.id;
            match r.by_session.get(&id) {
                Some(&i) => r.writes[i] = write,
                None => {
                    let i = r.writes.len();
                    r.writes.push(write);
                    r.by_session.insert(id, i);
                }
            }
            !std::mem::replace(&mut r.scheduled, true)
        };
        if schedule {
            let batch = Arc::clone(self);
            let credits = Arc::clone(credits);
            tokio::spawn(async move {
                tokio::time::sleep(FLUSH_DELAY).await;
                batch.flush(&credits);
            });
        }
    }

    /// Posts the round's writes, [`MAX_BATCH`] per transport call, and counts each as
    /// posted or refused and each call as a batch. Returns the writes posted or refused.
    pub(crate) fn flush(&self, credits: &CreditBudget) -> usize {
        let writes = {
            let mut r = self.lock();
            r.by_session.clear();
            r.scheduled = false;
            std::mem::take(&mut r.writes)
        };
        for chunk in writes.chunks(MAX_BATCH) {
            let wrs: Vec<SendWr<'_>> = chunk.iter().map(PendingWrite::wr).collect();
            let lists: Vec<QpSendList<'_, '_>> = chunk
                .iter()
                .zip(&wrs)
                .map(|(w, wr)| QpSendList {
                    qp: &w.session.qp,
                    wrs: std::slice::from_ref(wr),
                })
                .collect();
            for result in post_send_batch(&lists) {
                credits.count_write(result.is_ok());
            }
            credits.count_batch();
        }
        writes.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
