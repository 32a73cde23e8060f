//! How a reload (`crate::reload`) replaces an asynchronous output's endpoint without losing a
//! record: the parts every output shares (`remote_write`'s `live` module, `clickhouse`,
//! `otlp`).
//!
//! - [`Lifetime`]: an endpoint's tasks stop when the collector stops or when a reload
//!   retires the endpoint alone, and say when they have all ended.
//! - [`hand_over`]: retires the old endpoints, waits until each has sent what it holds
//!   (within the grace period it has at shutdown), counts what is left `reason="reload"`,
//!   and only then starts the new ones, so a receiver never gets a record queued later
//!   before one queued earlier.
//! - [`Slot`] and [`Replacement`]: the endpoint in force of an output that has at most one
//!   (`outputs.clickhouse`, `outputs.otlp`). The worker holds its lock shared while it
//!   pushes a frame's records; a reload swaps it exclusive. A record pushed before the swap
//!   goes to the old endpoint, one pushed after to the new one, and none reaches a retired
//!   endpoint after the swap: each record is sent by exactly the endpoint in force when the
//!   worker accepted it, or counted dropped. A [`Replacement`] is built first (everything
//!   that can fail) and swapped in later, so a reload that changes several outputs changes
//!   none when one of them cannot be built.
//! - [`SlotEndpoint`]: what [`Slot::start`] and [`Slot::prepare`] need of such an output.
//! - [`registered`]: an output's self-metrics, registered once and shared by every endpoint
//!   it has.
//! - [`Tasks`]: the tasks reloads started, awaited when the collector stops.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use tokio::task::JoinHandle;
use uctel_common::shutdown::{self, Shutdown, ShutdownTrigger};

use super::http::SetupError;

/// A task of an endpoint, not yet spawned.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An endpoint's tasks: stopped with the collector or alone (a reload retired it).
#[derive(Debug)]
pub(crate) struct Lifetime {
    /// Stops this endpoint alone.
    stop: ShutdownTrigger,
    /// Fired (or dropped) once every task of the endpoint has ended.
    done: Mutex<Option<ShutdownTrigger>>,
    finished: Shutdown,
}

impl Default for Lifetime {
    fn default() -> Self {
        let (stop, _) = shutdown::channel();
        let (done, finished) = shutdown::channel();
        Lifetime {
            stop,
            done: Mutex::new(Some(done)),
            finished,
        }
    }
}

impl Lifetime {
    /// Stops the endpoint's tasks as at shutdown (grace period included).
    pub(crate) fn retire(&self) {
        self.stop.trigger();
    }

    /// Completes once every task of the endpoint has ended (at once when it never started).
    pub(crate) async fn finished(&self) {
        let never_started = lock(&self.done).take().is_some();
        if never_started {
            return; // Dropping the trigger fired `finished`.
        }
        self.finished.clone().wait().await;
    }

    /// Spawns on `runtime` the tasks `tasks` builds from the endpoint's stop handle (fired
    /// when `global` fires or the endpoint is retired). The returned task ends after all of
    /// them (a panic in one is resumed there). `None` when already started (or finished).
    pub(crate) fn spawn(
        &self,
        runtime: &tokio::runtime::Handle,
        global: &Shutdown,
        tasks: impl FnOnce(Shutdown) -> Vec<Task>,
    ) -> Option<JoinHandle<()>> {
        let done = lock(&self.done).take()?;
        let stopped = self.stop.subscribe();
        let (mut global, mut own, stop) = (global.clone(), stopped.clone(), self.stop.clone());
        let tasks = tasks(stopped);
        Some(runtime.spawn(async move {
            let mut handles = vec![tokio::spawn(async move {
                tokio::select! {
                    () = global.wait() => {}
                    () = own.wait() => {}
                }
                stop.trigger();
            })];
            handles.extend(tasks.into_iter().map(tokio::spawn));
            let mut panic = None;
            for t in handles {
                if let Err(e) = t.await {
                    if e.is_panic() && panic.is_none() {
                        panic = Some(e.into_panic());
                    }
                }
            }
            done.trigger();
            if let Some(p) = panic {
                std::panic::resume_unwind(p);
            }
        }))
    }
}

/// One endpoint of an output, as [`hand_over`] drives it.
pub(crate) trait Endpoint: Send + Sync + 'static {
    /// What starting and retiring an endpoint of the output needs (its runtime, the
    /// collector's shutdown, the registry its counters are scraped from).
    type Context: Send + Sync + 'static;

    /// The endpoint's tasks.
    fn lifetime(&self) -> &Lifetime;

    /// Starts the endpoint's tasks (`None`: no runtime, or already started).
    fn start(&self, ctx: &Self::Context) -> Option<JoinHandle<()>>;

    /// Makes the endpoint's queues part of the scrapes (before it takes any record).
    fn activate(self: &Arc<Self>, ctx: &Self::Context);

    /// Retires the endpoint: marks its targets retired (what the grace period leaves is
    /// then settled `reload`, not `shutdown`), then stops its tasks ([`Lifetime::retire`]).
    fn retire(&self);

    /// The endpoint's tasks have ended after it was retired: counts what it still holds
    /// `reload`, takes it out of the scrapes (its counters keep their values) and logs.
    /// `replaced`: a successor takes over its records.
    fn retired(&self, ctx: &Self::Context, replaced: bool);
}

/// Retires `olds`, waits for each to finish (what it holds sent within its grace period,
/// the rest counted `reload`: [`Endpoint::retired`]), then starts `news`. Returns the tasks
/// of `news`.
pub(crate) async fn hand_over<E: Endpoint>(
    ctx: &E::Context,
    olds: &[Arc<E>],
    news: &[Arc<E>],
) -> Vec<JoinHandle<()>> {
    for e in olds {
        e.retire();
    }
    for e in olds {
        e.lifetime().finished().await;
        e.retired(ctx, !news.is_empty());
    }
    news.iter().filter_map(|e| e.start(ctx)).collect()
}

/// The tasks reloads started (endpoints, hand-overs), awaited when the collector stops.
#[derive(Debug, Default)]
pub(crate) struct Tasks(Mutex<Vec<JoinHandle<()>>>);

impl Tasks {
    /// Keeps `tasks` for [`Tasks::join`].
    pub(crate) fn extend(&self, tasks: impl IntoIterator<Item = JoinHandle<()>>) {
        lock(&self.0).extend(tasks);
    }

    /// Waits for every task kept, including those kept while it waits.
    pub(crate) async fn join(&self) {
        loop {
            let tasks = std::mem::take(&mut *lock(&self.0));
            if tasks.is_empty() {
                return;
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }
}

/// The endpoint in force of an output that has at most one (module docs).
#[derive(Debug)]
pub(crate) struct Slot<E> {
    current: RwLock<Option<Arc<E>>>,
    tasks: Tasks,
}

impl<E> Default for Slot<E> {
    fn default() -> Self {
        Slot::new(None)
    }
}

impl<E> Slot<E> {
    /// A slot holding `current` (already started by the caller, or never to start).
    pub(crate) fn new(current: Option<Arc<E>>) -> Slot<E> {
        Slot {
            current: RwLock::new(current),
            tasks: Tasks::default(),
        }
    }

    /// The endpoint in force, held (shared) until the guard drops: a reload's swap waits
    /// for it.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Option<Arc<E>>> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `e` in force without a hand-over (at start, before any record is pushed).
    pub(crate) fn install(&self, e: Arc<E>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(e);
    }

    /// The endpoint in force now.
    pub(crate) fn get(&self) -> Option<Arc<E>> {
        self.read().clone()
    }

    /// Waits for the tasks reloads started ([`Tasks::join`]).
    pub(crate) async fn join(&self) {
        self.tasks.join().await;
    }
}

/// An [`Endpoint`] of an output that has at most one in force (a [`Slot`]'s:
/// `outputs.clickhouse`, `outputs.otlp`).
pub(crate) trait SlotEndpoint: Endpoint + Sized {
    /// The output's configuration (`ClickHouseConfig`, `OtlpConfig`).
    type Config: PartialEq;
    /// The output's configuration key (`outputs.clickhouse`), named by its errors.
    const KEY: &'static str;
    /// The output's name in log lines and errors (`ClickHouse`, `OTLP`).
    const NAME: &'static str;

    /// The runtime the endpoints run on (`None`: the output was started outside one).
    fn runtime(ctx: &Self::Context) -> Option<&tokio::runtime::Handle>;

    /// Builds the endpoint of `config` in `ctx` (nothing started, nothing counted yet).
    ///
    /// # Errors
    /// [`SetupError`] for a setting that cannot be put in force (an unreadable secret, an
    /// invalid URL, a failed registration).
    fn build(ctx: &Self::Context, config: &Self::Config) -> Result<Arc<Self>, SetupError>;

    /// The configuration the endpoint was built from.
    fn config(&self) -> &Self::Config;

    /// The endpoint as log lines name it (its URL without credentials).
    fn label(&self) -> String;
}

/// The error of an output of `E` asked to start or change outside a tokio runtime.
fn no_runtime<E: SlotEndpoint>() -> SetupError {
    SetupError::Invalid {
        key: E::KEY.into(),
        message: format!(
            "the {} output needs a tokio runtime to run its senders",
            E::NAME
        ),
    }
}

impl<E: SlotEndpoint> Slot<E> {
    /// Puts the endpoint of `config` in force at start (before any record is pushed):
    /// built in `ctx`, its queues made part of the scrapes, its tasks started. Returns the
    /// tasks.
    ///
    /// # Errors
    /// [`SetupError`] outside a tokio runtime, or [`SlotEndpoint::build`]'s.
    pub(crate) fn start(
        &self,
        ctx: &E::Context,
        config: &E::Config,
    ) -> Result<Vec<JoinHandle<()>>, SetupError> {
        if E::runtime(ctx).is_none() {
            return Err(no_runtime::<E>());
        }
        let e = E::build(ctx, config)?;
        e.activate(ctx);
        let tasks = e.start(ctx).into_iter().collect();
        self.install(e);
        Ok(tasks)
    }

    /// What a reload that wants `config` for this slot (`None`: the output removed) does:
    /// `None` when it is the configuration of the endpoint in force; else the
    /// [`Replacement`] by the endpoint built in `ctx` (run on its runtime once committed)
    /// and the line that says what changes (`ClickHouse http://…: added`).
    ///
    /// # Errors
    /// [`SetupError`] when the output was built without `ctx` or outside a tokio runtime,
    /// or [`SlotEndpoint::build`]'s: nothing changed.
    pub(crate) fn prepare(
        self: &Arc<Self>,
        ctx: Option<&Arc<E::Context>>,
        config: Option<&E::Config>,
    ) -> Result<Option<(Replacement<E>, String)>, SetupError> {
        let Some(ctx) = ctx else {
            return Err(SetupError::Invalid {
                key: E::KEY.into(),
                message: "this collector was built without its outputs started".into(),
            });
        };
        let Some(runtime) = E::runtime(ctx) else {
            return Err(no_runtime::<E>());
        };
        let old = self.get();
        if old.as_deref().map(E::config) == config {
            return Ok(None);
        }
        let new = config.map(|c| E::build(ctx, c)).transpose()?;
        let what = E::NAME;
        let line = match (&old, &new) {
            (None, Some(n)) => format!("{what} {}: added", n.label()),
            (Some(o), None) => format!("{what} {}: removed (draining)", o.label()),
            (Some(o), Some(n)) => format!(
                "{what} {}: changed to {} (the old endpoint drains, the new one queues from \
                 now and sends once it has finished)",
                o.label(),
                n.label()
            ),
            (None, None) => return Ok(None),
        };
        Ok(Some((Replacement::new(self, ctx, runtime, new), line)))
    }
}

/// The self-metrics of an output kept in `cell`: on first use made by `new` and registered
/// in `registry` through the collector `collector` wraps them in; the same ones after. One
/// set for the output's life, shared by every endpoint it has, so that a reload keeps its
/// series (and their sum rule) going.
///
/// # Errors
/// A `prometheus` error from `new` or the registration, as [`SetupError::Invalid`] under
/// `key` (`outputs.otlp`).
pub(crate) fn registered<F: Clone>(
    cell: &Mutex<Option<F>>,
    registry: &prometheus::Registry,
    key: &str,
    new: impl FnOnce() -> prometheus::Result<F>,
    collector: impl FnOnce(F) -> Box<dyn prometheus::core::Collector>,
) -> Result<F, SetupError> {
    let registration = |e: prometheus::Error| SetupError::Invalid {
        key: key.to_owned(),
        message: format!("self-metrics: {e}"),
    };
    let mut cell = lock(cell);
    if let Some(f) = cell.as_ref() {
        return Ok(f.clone());
    }
    let f = new().map_err(registration)?;
    registry
        .register(collector(f.clone()))
        .map_err(registration)?;
    *cell = Some(f.clone());
    Ok(f)
}

/// A change of a [`Slot`]'s endpoint: built (everything that can fail is done), not yet in
/// force. Dropped, it changes nothing.
pub(crate) struct Replacement<E: Endpoint> {
    slot: Arc<Slot<E>>,
    ctx: Arc<E::Context>,
    runtime: tokio::runtime::Handle,
    new: Option<Arc<E>>,
}

impl<E: Endpoint> Replacement<E> {
    /// The change of `slot` to `new` (built in `ctx`), run on `runtime` once committed.
    pub(crate) fn new(
        slot: &Arc<Slot<E>>,
        ctx: &Arc<E::Context>,
        runtime: &tokio::runtime::Handle,
        new: Option<Arc<E>>,
    ) -> Replacement<E> {
        Replacement {
            slot: slot.clone(),
            ctx: ctx.clone(),
            runtime: runtime.clone(),
            new,
        }
    }

    /// Puts the new endpoint in force: into the scrapes, swapped in, then the hand-over
    /// from the old one ([`hand_over`]; with no old one it starts at once).
    pub(crate) fn commit(self) {
        if let Some(e) = &self.new {
            e.activate(&self.ctx);
        }
        let old = {
            let mut current = self
                .slot
                .current
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *current, self.new.clone())
        };
        let news: Vec<Arc<E>> = self.new.into_iter().collect();
        let Some(old) = old else {
            let ctx = &self.ctx;
            self.slot
                .tasks
                .extend(news.iter().filter_map(|e| e.start(ctx)));
            return;
        };
        let (slot, ctx) = (self.slot.clone(), self.ctx);
        let t = self.runtime.spawn(async move {
            let started = hand_over(&*ctx, &[old], &news).await;
            slot.tasks.extend(started);
        });
        self.slot.tasks.extend([t]);
    }
}
