//! The remote-write endpoints in force, and their change by a reload (`crate::reload`,
//! README "Reload").
//!
//! **Which endpoints a sample goes to.** The endpoint list in force sits behind a lock with
//! a generation number; every connection's [`RemoteWrite`](super::RemoteWrite) keeps a copy
//! and holds the lock (shared) while it pushes a batch, refreshing its copy when the
//! generation moved. A reload swaps the list under the lock (exclusive): a batch pushed
//! before the swap went to the old list whole, one pushed after goes to the new list whole,
//! and no sample reaches a removed endpoint after the swap. Each sample thus goes to exactly
//! the endpoints configured when the worker accepted it.
//!
//! **What a reload does to each endpoint** (endpoints are matched by their whole setting,
//! `outputs.remote_write[i]`, in order):
//!
//! - unchanged: kept as it is, queue, series table, senders and counters untouched;
//! - removed: retired. Its senders get the grace period they have at shutdown
//!   (`min(5 s, timeout_seconds)`) to send what it holds; what is still queued then is counted
//!   `samples_dropped_total{reason="reload"}`, a request still failing
//!   `samples_failed_total{reason="reload"}`. Its counters stay exported (they keep their
//!   last values), so the sum rule `in = sent + failed + dropped + pending` holds for its
//!   `url` at every scrape;
//! - changed (same `url`, other settings): the old endpoint is retired as above, and the new
//!   one queues every sample from the swap on but starts sending only once the old one has
//!   finished, so a receiver never gets an older sample of a series after a newer one (a
//!   Prometheus receiver refuses that, out of order). Both count under the same `url`
//!   labels: the sum rule holds across the handover. While it waits its queue may fill; what
//!   it pushes out is counted `queue_full` as always;
//! - added (a new `url`): started at once.
//!
//! The new endpoints' series tables start empty, as at a start: a series continues at the
//! receiver (no stale marker is sent for a series that simply moves to the new endpoint).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use uctel_common::shutdown::Shutdown;

use super::metrics::{Dropped, Families};
use super::queue::Shards;
use super::sender::{self, Target};
use super::{expire_loop, stall_loop, tally, LockedCollector, SHUTDOWN_GRACE};
use crate::outputs::config::RemoteWriteConfig;
use crate::outputs::handover::{self, lock, Lifetime, Task, Tasks};
use crate::outputs::http::{self, SetupError};

/// One configured endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(super) shards: Arc<Shards>,
    target: Arc<Target>,
    config: RemoteWriteConfig,
    /// The URL without credentials (the `url` label).
    label: String,
    /// Its tasks, stopped alone when a reload retires it.
    life: Lifetime,
}

/// The endpoint list in force and its generation (module docs).
#[derive(Debug, Default)]
pub(crate) struct Current {
    /// Bumped by every swap.
    pub(crate) generation: u64,
    /// The endpoints, in configuration order.
    pub(crate) endpoints: Arc<[Arc<Endpoint>]>,
}

/// What every connection's handle shares: the list in force and what a reload needs.
#[derive(Debug, Default)]
pub(crate) struct Live {
    current: RwLock<Current>,
    nonempty: AtomicBool,
    context: Option<Arc<Context>>,
    /// Tasks reloads started (endpoints, retiring), awaited at shutdown.
    tasks: Tasks,
    /// One reload at a time.
    reconfiguring: Mutex<()>,
}

/// What starting an endpoint needs, kept for reloads.
pub(crate) struct Context {
    registry: prometheus::Registry,
    /// The self-metric families, registered with the first endpoint.
    families: Mutex<Option<Families>>,
    /// The endpoints a scrape reads under their shard locks (`LockedCollector`).
    registered: Arc<Mutex<Vec<Arc<Shards>>>>,
    staleness: Duration,
    /// `series_cap_per_agent`, shared by every endpoint's shards.
    series_cap_per_agent: Arc<AtomicUsize>,
    dead_peer: Duration,
    shutdown: Shutdown,
    runtime: Option<tokio::runtime::Handle>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("staleness", &self.staleness)
            .field("series_cap_per_agent", &self.series_cap_per_agent)
            .field("dead_peer", &self.dead_peer)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The context of the collector's remote-write output; the tokio runtime it runs on is
    /// the current one (none outside a runtime: then no endpoint can start).
    pub(crate) fn new(
        registry: prometheus::Registry,
        staleness: Duration,
        series_cap_per_agent: usize,
        dead_peer: Duration,
        shutdown: Shutdown,
    ) -> Context {
        Context {
            registry,
            families: Mutex::new(None),
            registered: Arc::new(Mutex::new(Vec::new())),
            staleness,
            series_cap_per_agent: Arc::new(AtomicUsize::new(series_cap_per_agent)),
            dead_peer,
            shutdown,
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// The families, registered on first use.
    fn families(&self) -> Result<Families, SetupError> {
        handover::registered(
            &self.families,
            &self.registry,
            "outputs.remote_write",
            Families::new,
            |f| Box::new(LockedCollector::new(f, self.registered.clone())),
        )
    }

    /// Builds endpoint `i` of `c` (nothing started, nothing counted yet).
    pub(crate) fn endpoint(
        &self,
        i: usize,
        c: &RemoteWriteConfig,
    ) -> Result<Arc<Endpoint>, SetupError> {
        let prefix = format!("outputs.remote_write[{i}]");
        if self.runtime.is_none() {
            return Err(SetupError::Invalid {
                key: prefix,
                message: "remote-write needs a tokio runtime to run its senders".into(),
            });
        }
        let label = http::redact(&c.url);
        let url = reqwest::Url::parse(&c.url).map_err(|e| SetupError::Invalid {
            key: format!("{prefix}.url"),
            message: e.to_string(),
        })?;
        let mut headers = http::header_map(
            &prefix,
            c.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )?;
        if let Some(t) = &c.tenant {
            headers.extend(http::header_map(&prefix, [("X-Scope-OrgID", t.as_str())])?);
        }
        let auth = http::authorization(
            &prefix,
            c.basic_auth.as_ref(),
            c.bearer_token_file.as_deref(),
        )?;
        let client = http::client(
            &prefix,
            c.timeout(),
            &c.tls,
            http::with_authorization(headers, auth),
        )?;
        let counters = Arc::new(self.families()?.endpoint(&label));
        let shards = Arc::new(
            Shards::new(
                c.shards as usize,
                c.queue_capacity_samples as usize,
                c.max_samples_per_send as usize,
                0,
                counters,
            )
            .with_shared_cap(self.series_cap_per_agent.clone())
            .with_dead_peer(self.dead_peer, &label),
        );
        let target = Arc::new(Target {
            client,
            url,
            label: label.clone(),
            deadline: c.batch_deadline(),
            backoff: c.backoff(),
            grace: SHUTDOWN_GRACE.min(c.timeout()),
            log: Mutex::default(),
            retired: AtomicBool::new(false),
        });
        Ok(Arc::new(Endpoint {
            shards,
            target,
            config: c.clone(),
            label,
            life: Lifetime::default(),
        }))
    }

    /// Makes `e` part of the scrapes (its shard locks held while the families are read).
    pub(crate) fn activate(&self, e: &Endpoint) {
        e.shards
            .counters()
            .shards
            .set(i64::try_from(e.shards.shards.len()).unwrap_or(i64::MAX));
        lock(&self.registered).push(e.shards.clone());
    }

    /// Takes `e` out of the scrapes (retired, its tasks over); its counters keep their
    /// values.
    fn deactivate(&self, e: &Endpoint) {
        lock(&self.registered).retain(|s| !Arc::ptr_eq(s, &e.shards));
    }

    /// Starts `e`'s tasks: one sender per shard, the expiry and stall watches, the output
    /// log; they end when the collector's shutdown or `e`'s own stop fires (and the grace
    /// period). The returned task ends after all of them.
    pub(crate) fn spawn(&self, e: &Endpoint) -> Option<tokio::task::JoinHandle<()>> {
        let runtime = self.runtime.as_ref()?;
        let (staleness, dead_peer) = (self.staleness, self.dead_peer);
        let (shards, target, label) = (e.shards.clone(), e.target.clone(), e.label.clone());
        let started = e.life.spawn(runtime, &self.shutdown, |stopped| {
            let mut tasks: Vec<Task> = vec![Box::pin(crate::outputs::report::run(
                "remote-write",
                {
                    let label = label.clone();
                    move || label.clone()
                },
                "samples",
                tally(shards.counters().clone()),
                target.grace,
                stopped.clone(),
            ))];
            for (si, shard) in shards.shards.iter().enumerate() {
                tasks.push(Box::pin(sender::run(
                    target.clone(),
                    shards.clone(),
                    shard.clone(),
                    si,
                    stopped.clone(),
                )));
            }
            tasks.push(Box::pin(expire_loop(
                shards.clone(),
                staleness,
                stopped.clone(),
            )));
            if dead_peer < Duration::MAX {
                tasks.push(Box::pin(stall_loop(shards.clone(), stopped)));
            }
            tasks
        })?;
        tracing::info!(url = %label, shards = e.shards.shards.len(), "remote-write output started");
        Some(started)
    }
}

impl handover::Endpoint for Endpoint {
    type Context = Context;

    fn lifetime(&self) -> &Lifetime {
        &self.life
    }

    fn start(&self, ctx: &Context) -> Option<tokio::task::JoinHandle<()>> {
        ctx.spawn(self)
    }

    fn activate(self: &Arc<Self>, ctx: &Context) {
        ctx.activate(self);
    }

    fn retire(&self) {
        self.target.retired.store(true, Ordering::Release);
        self.life.retire();
    }

    fn retired(&self, ctx: &Context, replaced: bool) {
        // The senders settled what they held; anything pushed since is counted here.
        self.shards.drop_all(Dropped::Reload);
        ctx.deactivate(self);
        let c = self.shards.counters();
        if !replaced {
            c.series.set(0);
            c.shards.set(0);
        }
        tracing::info!(
            url = %self.label,
            sent = c.samples_sent(),
            dropped_at_reload = c.dropped(Dropped::Reload),
            "remote-write endpoint retired by a reload"
        );
    }
}

impl Live {
    /// The list `endpoints` in force, generation 0.
    pub(crate) fn new(context: Context, endpoints: Arc<[Arc<Endpoint>]>) -> Live {
        for e in endpoints.iter() {
            context.activate(e);
        }
        Live {
            nonempty: AtomicBool::new(!endpoints.is_empty()),
            current: RwLock::new(Current {
                generation: 0,
                endpoints,
            }),
            context: Some(Arc::new(context)),
            tasks: Tasks::default(),
            reconfiguring: Mutex::default(),
        }
    }

    /// The list in force, held (shared) until the guard drops.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Current> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// True when no endpoint is in force.
    pub(crate) fn is_empty(&self) -> bool {
        !self.nonempty.load(Ordering::Acquire)
    }

    /// Waits for every task reloads started (module docs), including those they start
    /// while it waits.
    pub(crate) async fn join(&self) {
        self.tasks.join().await;
    }

    /// Sets the series cap per agent of every endpoint, present and future.
    pub(crate) fn set_series_cap(&self, cap: usize) {
        if let Some(c) = self.context.as_ref() {
            c.series_cap_per_agent.store(cap, Ordering::Relaxed);
        }
    }

    /// Puts `configs` in force (module docs); one line per endpoint that changed.
    pub(crate) fn reconfigure(
        self: &Arc<Live>,
        configs: &[RemoteWriteConfig],
    ) -> Result<Vec<String>, SetupError> {
        let _one = lock(&self.reconfiguring);
        let Some(context) = self.context.as_ref() else {
            return Err(SetupError::Invalid {
                key: "outputs.remote_write".into(),
                message: "this collector was built without its outputs started".into(),
            });
        };
        let old = self.read().endpoints.clone();
        let mut kept = vec![false; old.len()];
        let mut next = Vec::with_capacity(configs.len());
        let mut fresh = Vec::new();
        // Everything that can fail first: nothing changes on an error.
        for (i, c) in configs.iter().enumerate() {
            if let Some(j) = (0..old.len()).find(|&j| !kept[j] && old[j].config == *c) {
                kept[j] = true;
                next.push(old[j].clone());
            } else {
                let e = context.endpoint(i, c)?;
                fresh.push(e.clone());
                next.push(e);
            }
        }
        let retired: Vec<Arc<Endpoint>> = old
            .iter()
            .zip(&kept)
            .filter(|(_, k)| !**k)
            .map(|(e, _)| e.clone())
            .collect();
        for e in &fresh {
            context.activate(e);
        }
        {
            let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
            current.generation += 1;
            current.endpoints = next.into();
            self.nonempty
                .store(!current.endpoints.is_empty(), Ordering::Release);
        }
        let mut lines = Vec::new();
        let mut labels: Vec<&str> = fresh
            .iter()
            .chain(&retired)
            .map(|e| e.label.as_str())
            .collect();
        labels.sort_unstable();
        labels.dedup();
        for label in labels {
            let olds: Vec<_> = retired
                .iter()
                .filter(|e| e.label == label)
                .cloned()
                .collect();
            let news: Vec<_> = fresh.iter().filter(|e| e.label == label).cloned().collect();
            lines.push(match (olds.is_empty(), news.is_empty()) {
                (true, _) => format!("remote-write {label}: added"),
                (false, true) => format!("remote-write {label}: removed (draining)"),
                (false, false) => format!(
                    "remote-write {label}: changed (the old endpoint drains, the new one \
                     queues from now and sends once it has finished)"
                ),
            });
            if olds.is_empty() {
                self.tasks
                    .extend(news.iter().filter_map(|e| context.spawn(e)));
                continue;
            }
            let live = self.clone();
            if let Some(runtime) = context.runtime.as_ref() {
                let t = runtime.spawn(async move {
                    let Some(context) = live.context.as_ref() else {
                        return;
                    };
                    let started = handover::hand_over(&**context, &olds, &news).await;
                    live.tasks.extend(started);
                });
                self.tasks.extend([t]);
            }
        }
        Ok(lines)
    }
}
