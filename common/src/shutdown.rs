//! Shutdown signalling: one [`ShutdownTrigger`] fires, any number of [`Shutdown`] handles
//! see it. [`on_signals`] fires the trigger on SIGTERM or SIGINT (tokio signal handlers),
//! which is what systemd, Kubernetes and Ctrl-C send.
//!
//! Built on a `tokio::sync::watch` channel: a handle created after the trigger fired still
//! sees it, and dropping the trigger without firing also counts as shutdown (so a daemon
//! cannot outlive the thing that owns its lifetime).

use tokio::sync::watch;

/// Fires shutdown for every [`Shutdown`] cloned from its pair.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// A cloneable handle to wait for shutdown.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// Creates a trigger and its first handle.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, Shutdown { rx })
}

impl ShutdownTrigger {
    /// Fires shutdown. Idempotent.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// A new handle (same as cloning one).
    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    /// True once shutdown fired (or the trigger was dropped). Cheap; for polling loops on
    /// threads that are not async (completion pollers).
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow() || self.rx.has_changed().is_err()
    }

    /// Completes when shutdown fires (or the trigger is dropped). Cancel-safe.
    pub async fn wait(&mut self) {
        // `wait_for` returns Err only when the sender is gone, which also means shutdown.
        let _ = self.rx.wait_for(|fired| *fired).await;
    }

    /// Like [`Shutdown::wait`] but consumes a clone, for `with_graceful_shutdown`-style APIs
    /// that take a `'static` future.
    pub fn wait_owned(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut me = self.clone();
        async move { me.wait().await }
    }
}

/// Installs SIGTERM and SIGINT handlers and returns a handle that fires on the first of them
/// (plus the trigger, so the daemon can also shut itself down). SIGHUP reloads the
/// configuration once the daemon has said how ([`crate::reload::on_sighup`]); before that
/// it is logged and ignored (its default action would kill the daemon without a Goodbye).
/// Must be called inside a tokio runtime. Errors: the OS refused to install a handler.
pub fn on_signals() -> std::io::Result<(ShutdownTrigger, Shutdown)> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let (trigger, shutdown) = channel();
    let mut hup_own = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = hup.recv() => {
                    if r.is_none() {
                        return;
                    }
                    let Some(reload) = crate::reload::sighup_handler() else {
                        tracing::warn!(
                            "SIGHUP received before the daemon finished starting; ignored \
                             (send it again to reload the configuration)"
                        );
                        continue;
                    };
                    tracing::info!("SIGHUP received: reloading the configuration");
                    // The outcome is logged by the reload itself.
                    let _ = tokio::task::spawn_blocking(move || reload.run()).await;
                }
                _ = hup_own.wait() => return,
            }
        }
    });
    let t = trigger.clone();
    let mut own = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
            _ = own.wait() => return,
        }
        t.trigger();
    });
    Ok((trigger, shutdown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_wakes_all_handles() {
        let (trigger, a) = channel();
        let b = a.clone();
        assert!(!a.is_triggered());
        let wa = tokio::spawn(a.wait_owned());
        let wb = tokio::spawn(b.wait_owned());
        trigger.trigger();
        wa.await.unwrap();
        wb.await.unwrap();
        // Late subscribers see it too.
        let mut late = trigger.subscribe();
        assert!(late.is_triggered());
        late.wait().await;
    }

    #[tokio::test]
    async fn dropped_trigger_means_shutdown() {
        let (trigger, mut s) = channel();
        drop(trigger);
        assert!(s.is_triggered());
        s.wait().await;
    }

    #[tokio::test]
    async fn not_triggered_stays_pending() {
        let (_trigger, mut s) = channel();
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), s.wait()).await;
        assert!(waited.is_err());
    }
}
