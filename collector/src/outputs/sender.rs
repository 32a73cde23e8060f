//! The sender loop every asynchronous output shares (the ClickHouse output, each
//! remote-write shard): wait for a due batch, send it in parts, retry what may succeed
//! later, split what the receiver refused for some items only, and settle every item once.
//!
//! What differs between outputs is a [`Sink`]: how a batch is taken from its queue, encoded,
//! sent, how an answer is classified ([`Answer`]), and how items are settled and logged
//! (the model: Vector's split of a sink into its request builder, service and sink loop,
//! `src/sinks/clickhouse/{request_builder,service,sink}.rs`).
//!
//! The rules, the same for every output (each output's module docs say what they mean
//! for its receiver):
//!
//! * [`Answer::Sent`]: settled sent.
//! * [`Answer::Partial`]: applied except for a number of items the answer does not name
//!   (OTLP's partial success): [`Sink::settle_partly`].
//! * [`Answer::Retry`]: the same request again after a delay (exponential backoff with
//!   full jitter, the answer's `Retry-After` honoured and cut to the largest backoff).
//!   Nothing else is sent meanwhile; new items wait in the output's bounded queue.
//! * [`Answer::Unknown`]: the request may have been applied. It is never sent again blindly:
//!   the sink is asked whether it landed ([`Sink::check`]), with backoff, until the receiver
//!   answers; landed: settled sent; absent twice in a row (one backoff apart): sent again.
//! * [`Answer::Refused`]: a refusal that may concern some items only
//!   ([`Refused::by_item`]) splits the part around the item the answer names, else in
//!   halves ([`super::http::split`]), while the sink allows more requests
//!   ([`Sink::may_split`]); an item refused alone, or a part refused as a whole, is settled
//!   rejected, never retried.
//!
//! At shutdown the loop gets the sink's grace period: a request still failing (or not
//! checked) then is settled `shutdown`, and so is what is still queued.

use std::future::Future;
use std::ops::Range;
use std::time::{Duration, Instant};

use uctel_common::shutdown::Shutdown;

use super::http::{split, Backoff};

/// The timing of a sender loop (the batch deadline is the sink's, [`Sink::due`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Backoff bounds (first delay, largest delay).
    pub(crate) backoff: (Duration, Duration),
    /// Grace period at shutdown.
    pub(crate) grace: Duration,
}

/// A refusal for good ([`Answer::Refused`]).
#[derive(Debug)]
pub(crate) struct Refused {
    /// The refusal may concern some items of the request only: split and send again.
    pub(crate) by_item: bool,
    /// The 1-based item of the request the answer names, if it names one.
    pub(crate) named: Option<usize>,
    /// A refusal of the whole output (no such table): logged as an error.
    pub(crate) fatal: bool,
    /// Status and answer, for logs.
    pub(crate) why: String,
}

/// A request's fate, as the sink classified the receiver's answer (module docs).
#[derive(Debug)]
pub(crate) enum Answer {
    /// Applied.
    Sent,
    /// Applied, except `rejected` items the answer does not name (OTLP's partial success,
    /// `rejected_data_points`/`rejected_log_records`), for the reason `why`.
    Partial {
        /// Items refused (at most the request's).
        rejected: usize,
        /// The receiver's message.
        why: String,
    },
    /// Not applied: send again after a delay (the answer's `Retry-After`, if any).
    Retry(Option<Duration>, String),
    /// Maybe applied: ask whether it landed before sending it again.
    Unknown(String),
    /// Refused for good.
    Refused(Refused),
}

/// What a check of a request of unknown outcome found ([`Sink::check`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Every item of the request is stored.
    Landed,
    /// Not there (and the earlier attempt not running).
    Absent,
    /// The earlier attempt still runs on the receiver.
    Running,
    /// The receiver did not answer (the reason).
    Failed(String),
}

impl Check {
    /// The `result` label of the output's checks counter.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Check::Landed => "landed",
            Check::Absent => "absent",
            Check::Running => "running",
            Check::Failed(_) => "failed",
        }
    }
}

/// How the items of a part end.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Settle<'a> {
    /// Stored by the receiver.
    Sent,
    /// Refused for good (the answer, or why the request could not be built).
    Rejected(&'a str),
    /// Still failing, or not checked, when the grace period ended (why).
    Shutdown(&'a str),
}

/// What the loop tells the sink to log (each sink words and rate-limits its lines).
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// A request failed and is sent again after `delay`.
    Retry {
        items: usize,
        why: &'a str,
        delay: Duration,
    },
    /// A request still failed when the grace period ended: settled `shutdown`.
    GaveUp { items: usize, why: &'a str },
    /// A request of unknown outcome was not checked before the grace period ended.
    Unchecked { items: usize, why: &'a str },
    /// A request of unknown outcome: its items are checked before it is sent again.
    Unknown { items: usize, why: &'a str },
    /// A request of unknown outcome had landed: settled sent, not sent again.
    Landed { items: usize },
    /// A check of a request of unknown outcome got no answer; asked again.
    CheckFailed { items: usize, why: &'a str },
    /// One item refused alone (the part logged is that item).
    ItemRefused { refused: &'a Refused },
    /// A part refused as a whole.
    PartRefused { items: usize, refused: &'a Refused },
    /// A request could not be built from its items.
    NotEncoded { items: usize, why: &'a str },
    /// A batch had items refused alone; the rest was sent.
    Isolated {
        items: usize,
        refused: usize,
        requests: usize,
    },
    /// Items still queued when the grace period ended: settled `shutdown`.
    NotSent { items: usize },
}

/// What differs between the outputs that share [`run`].
pub(crate) trait Sink: Send + Sync {
    /// One queued item (a row, a sample).
    type Item: Send + Sync;
    /// A request built from a part of a batch, kept for its retries (the encoded body, the
    /// request's identity).
    type Request: Send + Sync;

    /// The loop's timing.
    fn timing(&self) -> Timing;

    /// Woken when the queue gets its first item or a full batch.
    fn wake(&self) -> &tokio::sync::Notify;

    /// The batch to send if one is due at `now` (full, its deadline passed, or `flush`:
    /// stopping); else when the next one is due (`None`: when an item arrives).
    fn due(&self, now: Instant, flush: bool) -> Result<Vec<Self::Item>, Option<Instant>>;

    /// The items of a due batch that are still to be sent (the rest settled by the sink).
    fn admit(&self, batch: Vec<Self::Item>) -> Vec<Self::Item> {
        batch
    }

    /// The request of `part`, or why it cannot be built (its items are then rejected).
    fn encode(&mut self, part: &[Self::Item]) -> Result<Self::Request, String>;

    /// Sends `request` once and classifies the answer.
    fn send(&self, request: &Self::Request) -> impl Future<Output = Answer> + Send;

    /// Whether the items of `request` (built from `part`), sent with an answer of unknown
    /// outcome, were stored. A sink whose [`Sink::send`] never answers
    /// [`Answer::Unknown`] keeps this default.
    fn check(
        &self,
        part: &[Self::Item],
        request: &Self::Request,
    ) -> impl Future<Output = Check> + Send {
        let _ = (part, request);
        async { Check::Absent }
    }

    /// Settles the items `part` as `how` says.
    fn settle(&self, part: &[Self::Item], how: Settle<'_>);

    /// Settles the items `part` of a request the receiver applied except `rejected` items
    /// it does not name ([`Answer::Partial`]): by default the first `rejected` items
    /// rejected, the rest sent (the counts are what matters: no item is named).
    fn settle_partly(&self, part: &[Self::Item], rejected: usize, why: &str) {
        let r = rejected.min(part.len());
        self.settle(&part[..r], Settle::Rejected(why));
        self.settle(&part[r..], Settle::Sent);
    }

    /// Counts `items` sent again.
    fn retried(&self, items: usize);

    /// Counts one request's duration.
    fn observe(&self, seconds: f64);

    /// Counts one check's result.
    fn checked(&self, check: &Check) {
        let _ = check;
    }

    /// Whether a part refused for some items may be split again, after `requests`
    /// requests for its batch.
    fn may_split(&self, requests: usize) -> bool {
        let _ = requests;
        true
    }

    /// Settles every queued item `shutdown`; how many.
    fn drop_queued(&self) -> usize;

    /// Logs `event` for the items `part` of the batch, as the output words it.
    fn log(&mut self, event: Event<'_>, part: &[Self::Item]);
}

/// The loop's state of a shutdown: when the grace period ends.
struct Stop {
    shutdown: Shutdown,
    at: Option<tokio::time::Instant>,
    grace: Duration,
}

impl Stop {
    /// Sleeps `delay`, noting a shutdown that fires meanwhile.
    async fn sleep(&mut self, delay: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = self.shutdown.wait(), if self.at.is_none() => self.begin(),
        }
    }

    fn begin(&mut self) {
        self.at = Some(tokio::time::Instant::now() + self.grace);
    }

    /// Whether a delay of `delay` from now ends after the grace period.
    fn past(&self, delay: Duration) -> bool {
        self.at
            .is_some_and(|stop| tokio::time::Instant::now() + delay >= stop)
    }
}

/// Runs `sink` until `shutdown` fires and what is queued is sent or the grace period ends.
pub(crate) async fn run<S: Sink>(mut sink: S, shutdown: Shutdown) {
    let timing = sink.timing();
    let mut stop = Stop {
        shutdown,
        at: None,
        grace: timing.grace,
    };
    loop {
        let Some(batch) = next_batch(&sink, &mut stop).await else {
            return; // Stopping and nothing queued.
        };
        let batch = sink.admit(batch);
        if batch.is_empty() {
            continue;
        }
        send_batch(&mut sink, &batch, &mut stop, timing.backoff).await;
        if stop.past(Duration::ZERO) {
            let n = sink.drop_queued();
            if n > 0 {
                sink.log(Event::NotSent { items: n }, &[]);
            }
            return;
        }
    }
}

/// Waits until a batch is due (full, its deadline, or stopping); `None` when stopping with
/// nothing queued.
async fn next_batch<S: Sink>(sink: &S, stop: &mut Stop) -> Option<Vec<S::Item>> {
    loop {
        let wait = match sink.due(Instant::now(), stop.at.is_some()) {
            Ok(batch) => return Some(batch),
            Err(wait) => wait,
        };
        if stop.at.is_some() {
            return None;
        }
        let sleep = async {
            match wait {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sink.wake().notified() => {}
            _ = sleep => {}
            _ = stop.shutdown.wait() => stop.begin(),
        }
    }
}

/// Sends `batch` in parts: the whole first, a part refused for some items split and its
/// parts sent in order (the next one last on the stack).
async fn send_batch<S: Sink>(
    sink: &mut S,
    batch: &[S::Item],
    stop: &mut Stop,
    backoff: (Duration, Duration),
) {
    let mut parts: Vec<Range<usize>> = Vec::new();
    parts.push(0..batch.len());
    let (mut requests, mut isolated) = (0usize, 0usize);
    while let Some(range) = parts.pop() {
        requests += 1;
        let part = &batch[range.clone()];
        let Some(refused) = send_part(sink, part, stop, backoff).await else {
            continue;
        };
        if refused.by_item && part.len() > 1 && sink.may_split(requests) {
            let mut again = split(range, refused.named);
            again.reverse();
            parts.extend(again);
        } else if refused.by_item && part.len() == 1 {
            isolated += 1;
            sink.settle(part, Settle::Rejected(&refused.why));
            sink.log(Event::ItemRefused { refused: &refused }, part);
        } else {
            sink.settle(part, Settle::Rejected(&refused.why));
            let event = Event::PartRefused {
                items: part.len(),
                refused: &refused,
            };
            sink.log(event, part);
        }
    }
    if isolated > 0 {
        let event = Event::Isolated {
            items: batch.len(),
            refused: isolated,
            requests,
        };
        sink.log(event, batch);
    }
}

/// Sends `part` until it is stored, settled, or refused; the refusal is returned for the
/// batch to split or settle.
async fn send_part<S: Sink>(
    sink: &mut S,
    part: &[S::Item],
    stop: &mut Stop,
    backoff: (Duration, Duration),
) -> Option<Refused> {
    let request = match sink.encode(part) {
        Ok(r) => r,
        Err(why) => {
            sink.settle(part, Settle::Rejected(&why));
            let event = Event::NotEncoded {
                items: part.len(),
                why: &why,
            };
            sink.log(event, part);
            return None;
        }
    };
    let mut backoff = Backoff::new(backoff.0, backoff.1);
    let n = part.len();
    loop {
        let started = Instant::now();
        let answer = sink.send(&request).await;
        sink.observe(started.elapsed().as_secs_f64());
        match answer {
            Answer::Sent => {
                sink.settle(part, Settle::Sent);
                return None;
            }
            Answer::Partial { rejected, why } => {
                sink.settle_partly(part, rejected, &why);
                return None;
            }
            Answer::Refused(r) => return Some(r),
            Answer::Retry(after, why) => {
                let delay = backoff.next_delay(after);
                if stop.past(delay) {
                    sink.settle(part, Settle::Shutdown(&why));
                    sink.log(
                        Event::GaveUp {
                            items: n,
                            why: &why,
                        },
                        part,
                    );
                    return None;
                }
                sink.retried(n);
                let event = Event::Retry {
                    items: n,
                    why: &why,
                    delay,
                };
                sink.log(event, part);
                stop.sleep(delay).await;
            }
            Answer::Unknown(why) => {
                sink.log(
                    Event::Unknown {
                        items: n,
                        why: &why,
                    },
                    part,
                );
                if !until_checked(sink, part, &request, stop, &mut backoff, &why).await {
                    return None;
                }
                sink.retried(n);
            }
        }
    }
}

/// After an answer of unknown outcome (`why`): asks whether `request` landed until the
/// receiver answers. True when it is absent (checked twice, one backoff apart: an earlier
/// attempt the receiver accepted but had not started shows by then) and is to be sent
/// again; false when it is settled (landed, or the grace period ended).
async fn until_checked<S: Sink>(
    sink: &mut S,
    part: &[S::Item],
    request: &S::Request,
    stop: &mut Stop,
    backoff: &mut Backoff,
    why: &str,
) -> bool {
    let n = part.len();
    let mut absent = 0u32;
    loop {
        let delay = backoff.next_delay(None);
        if stop.past(delay) {
            sink.settle(part, Settle::Shutdown(why));
            sink.log(Event::Unchecked { items: n, why }, part);
            return false;
        }
        stop.sleep(delay).await;
        let check = sink.check(part, request).await;
        sink.checked(&check);
        match check {
            Check::Landed => {
                sink.settle(part, Settle::Sent);
                sink.log(Event::Landed { items: n }, part);
                return false;
            }
            Check::Absent if absent == 0 => absent = 1,
            Check::Absent => return true,
            Check::Running => absent = 0,
            Check::Failed(e) => {
                absent = 0;
                sink.log(Event::CheckFailed { items: n, why: &e }, part);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// A sink over numbers: `answers` scripts the answers to requests (then `answer`
    /// decides per request), every settle and event recorded.
    struct Numbers {
        queue: Mutex<Vec<u32>>,
        wake: tokio::sync::Notify,
        answers: Mutex<VecDeque<Answer>>,
        answer: fn(&[u32]) -> Answer,
        checks: Mutex<VecDeque<Check>>,
        settled: Mutex<Vec<(u32, &'static str)>>,
        retried: Mutex<usize>,
        events: Vec<String>,
    }

    impl Numbers {
        fn new(items: std::ops::Range<u32>, answer: fn(&[u32]) -> Answer) -> Numbers {
            Numbers {
                queue: Mutex::new(items.collect()),
                wake: tokio::sync::Notify::new(),
                answers: Mutex::default(),
                answer,
                checks: Mutex::default(),
                settled: Mutex::default(),
                retried: Mutex::new(0),
                events: Vec::new(),
            }
        }

        fn settled(&self, how: &str) -> Vec<u32> {
            let mut v: Vec<u32> = self
                .settled
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, h)| *h == how)
                .map(|(n, _)| *n)
                .collect();
            v.sort_unstable();
            v
        }
    }

    impl Sink for &mut Numbers {
        type Item = u32;
        type Request = Vec<u32>;

        fn timing(&self) -> Timing {
            Timing {
                backoff: (Duration::from_millis(1), Duration::from_millis(2)),
                grace: Duration::from_millis(50),
            }
        }

        fn wake(&self) -> &tokio::sync::Notify {
            &self.wake
        }

        fn due(&self, _now: Instant, _flush: bool) -> Result<Vec<u32>, Option<Instant>> {
            let batch = std::mem::take(&mut *self.queue.lock().unwrap());
            if batch.is_empty() {
                Err(None)
            } else {
                Ok(batch)
            }
        }

        fn encode(&mut self, part: &[u32]) -> Result<Vec<u32>, String> {
            Ok(part.to_vec())
        }

        async fn send(&self, request: &Vec<u32>) -> Answer {
            let scripted = self.answers.lock().unwrap().pop_front();
            scripted.unwrap_or_else(|| (self.answer)(request))
        }

        async fn check(&self, _part: &[u32], _request: &Vec<u32>) -> Check {
            self.checks
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Check::Absent)
        }

        fn settle(&self, part: &[u32], how: Settle<'_>) {
            let how = match how {
                Settle::Sent => "sent",
                Settle::Rejected(_) => "rejected",
                Settle::Shutdown(_) => "shutdown",
            };
            let mut settled = self.settled.lock().unwrap();
            settled.extend(part.iter().map(|n| (*n, how)));
        }

        fn retried(&self, items: usize) {
            *self.retried.lock().unwrap() += items;
        }

        fn observe(&self, _seconds: f64) {}

        fn may_split(&self, requests: usize) -> bool {
            requests < 64
        }

        fn drop_queued(&self) -> usize {
            let queued = std::mem::take(&mut *self.queue.lock().unwrap());
            self.settle(&queued, Settle::Shutdown("stopped"));
            queued.len()
        }

        fn log(&mut self, event: Event<'_>, part: &[u32]) {
            self.events.push(format!("{event:?} {part:?}"));
        }
    }

    fn refused(by_item: bool) -> Answer {
        Answer::Refused(Refused {
            by_item,
            named: None,
            fatal: false,
            why: "400".into(),
        })
    }

    /// Runs `sink` until its queue is empty and its batch settled (the shutdown fires at
    /// once: the loop sends what is queued within the grace period, then returns).
    async fn drive(sink: &mut Numbers) {
        let (trigger, shutdown) = uctel_common::shutdown::channel();
        trigger.trigger();
        let _ = tokio::time::timeout(Duration::from_secs(30), run(sink, shutdown)).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_item_costs_only_itself_and_a_request_wide_refusal_the_part() {
        // Item 7 of 0..10 is refused wherever it is; the rest is stored.
        let mut sink = Numbers::new(0..10, |r| {
            if r.contains(&7) {
                refused(true)
            } else {
                Answer::Sent
            }
        });
        drive(&mut sink).await;
        assert_eq!(sink.settled("rejected"), [7]);
        assert_eq!(sink.settled("sent"), [0, 1, 2, 3, 4, 5, 6, 8, 9]);
        assert!(sink
            .events
            .iter()
            .any(|e| e.starts_with("ItemRefused") && e.ends_with("[7]")));
        assert!(sink
            .events
            .iter()
            .any(|e| e.contains("Isolated { items: 10, refused: 1")));
        // Refused as a whole (no such table): the whole part, one request.
        let mut sink = Numbers::new(0..4, |_| refused(false));
        drive(&mut sink).await;
        assert_eq!(sink.settled("rejected"), [0, 1, 2, 3]);
        assert!(sink.events[0].starts_with("PartRefused { items: 4"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_retry_sends_again_and_an_unknown_outcome_is_checked_before() {
        let mut sink = Numbers::new(0..3, |_| Answer::Sent);
        sink.answers.lock().unwrap().extend([
            Answer::Retry(None, "503".into()),
            Answer::Unknown("timeout".into()),
        ]);
        // Still running, then absent twice: sent again.
        sink.checks
            .lock()
            .unwrap()
            .extend([Check::Running, Check::Absent, Check::Absent]);
        drive(&mut sink).await;
        assert_eq!(sink.settled("sent"), [0, 1, 2]);
        assert_eq!(
            *sink.retried.lock().unwrap(),
            6,
            "two sends again of 3 items"
        );
        assert!(
            sink.checks.lock().unwrap().is_empty(),
            "not checked to the end"
        );

        // Landed: settled sent, not sent again.
        let mut sink = Numbers::new(0..2, |_| panic!("sent again after it landed"));
        sink.answers
            .lock()
            .unwrap()
            .push_back(Answer::Unknown("reset".into()));
        sink.checks.lock().unwrap().push_back(Check::Landed);
        drive(&mut sink).await;
        assert_eq!(sink.settled("sent"), [0, 1]);
        assert_eq!(*sink.retried.lock().unwrap(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_still_failing_when_the_grace_period_ends_is_settled_shutdown() {
        let mut sink = Numbers::new(0..5, |_| Answer::Retry(None, "503".into()));
        drive(&mut sink).await;
        assert_eq!(sink.settled("shutdown"), [0, 1, 2, 3, 4]);
        assert!(sink.settled("sent").is_empty());
        assert!(sink
            .events
            .iter()
            .any(|e| e.starts_with("GaveUp { items: 5")));
    }
}
