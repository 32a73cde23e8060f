//! The one bounded wait: poll a probe until it says done or a deadline passes, then fail with
//! what the probe last said. [`wait_for`] blocks the thread (child-process tests, the
//! bench); [`wait_for_async`] sleeps on tokio's clock (in-process tests, whose daemons run on
//! the same runtime); [`until`] and [`eventually`] are the panicking forms the in-process
//! tests use. All four run the same loop ([`Deadline`]).
//!
//! A probe of the async forms returns `bool`, `Option<T>` or `Result<T, E: Display>`
//! ([`Outcome`]); [`wait_for`]'s returns `Result<T, String>`. `false`, `None` or `Err` mean
//! "not yet", and an `Err`'s text goes into the timeout message.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// Bound of [`eventually`]: generous, a slow CI machine must not fail a correct test.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Poll period of [`until`] and [`eventually`].
pub const POLL: Duration = Duration::from_millis(10);

/// What a probe said: done with a value, or not yet (and why).
pub trait Outcome {
    /// The value when done.
    type Value;
    /// `Ok(value)` when done, `Err(why not yet)` otherwise.
    fn into_result(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn into_result(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("condition not met".into())
        }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_result(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".into())
    }
}

impl<T, E: Display> Outcome for Result<T, E> {
    type Value = T;
    fn into_result(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// The rule every wait follows: probe first, then give up only once `timeout` has passed
/// since the start, naming `what` and the last answer.
#[derive(Debug)]
pub struct Deadline<'a> {
    what: &'a str,
    timeout: Duration,
    end: Instant,
}

impl<'a> Deadline<'a> {
    /// Starts the clock.
    pub fn start(what: &'a str, timeout: Duration) -> Deadline<'a> {
        Deadline {
            what,
            timeout,
            end: Instant::now() + timeout,
        }
    }

    /// `Some(result)` when the wait is over: the probe's value, or the timeout message.
    pub fn judge<T>(&self, probed: Result<T, String>) -> Option<Result<T, String>> {
        match probed {
            Ok(v) => Some(Ok(v)),
            Err(e) if Instant::now() >= self.end => Some(Err(format!(
                "{}: not reached after {:?}: {e}",
                self.what, self.timeout
            ))),
            Err(_) => None,
        }
    }
}

/// Polls `probe` every `every` (blocking the thread) until it is done or `timeout` passes.
/// The probe says `Ok(value)` or `Err(why not yet)` (a `bool` or `Option` probe converts
/// with [`Outcome::into_result`]).
///
/// # Errors
/// `what: not reached after <timeout>: <last answer>`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let d = Deadline::start(what, timeout);
    loop {
        if let Some(r) = d.judge(probe()) {
            return r;
        }
        std::thread::sleep(every);
    }
}

/// [`wait_for`] sleeping on tokio's clock, for a test that runs on the runtime of the
/// daemons it waits on.
///
/// # Errors
/// As [`wait_for`].
pub async fn wait_for_async<O: Outcome>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> O,
) -> Result<O::Value, String> {
    let d = Deadline::start(what, timeout);
    loop {
        if let Some(r) = d.judge(probe().into_result()) {
            return r;
        }
        tokio::time::sleep(every).await;
    }
}

/// [`wait_for_async`] every [`POLL`] within `timeout`; a timeout fails the test.
///
/// # Panics
/// With the timeout message.
pub async fn until<O: Outcome>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> O,
) -> O::Value {
    wait_for_async(what, timeout, POLL, probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`until`] for a probe that is itself async (an HTTP request, a channel read).
///
/// # Panics
/// With the timeout message.
pub async fn until_async<O, F>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> F,
) -> O::Value
where
    O: Outcome,
    F: std::future::Future<Output = O>,
{
    let d = Deadline::start(what, timeout);
    loop {
        if let Some(r) = d.judge(probe().await.into_result()) {
            return r.unwrap_or_else(|e| panic!("{e}"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`until`] within [`DEADLINE`].
///
/// # Panics
/// With the timeout message.
pub async fn eventually<O: Outcome>(what: &str, probe: impl FnMut() -> O) -> O::Value {
    until(what, DEADLINE, probe).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_done() {
        let mut n = 0;
        let v = wait_for("three", Duration::from_secs(5), Duration::ZERO, || {
            n += 1;
            (n >= 3).then_some(n).into_result()
        });
        assert_eq!(v, Ok(3));
    }

    #[test]
    fn a_timeout_names_what_and_the_last_answer() {
        let e = wait_for(
            "never",
            Duration::from_millis(30),
            Duration::from_millis(5),
            || Err::<(), _>("still 7".to_owned()),
        )
        .unwrap_err();
        assert!(
            e.starts_with("never: not reached after 30ms: still 7"),
            "{e}"
        );
        let e = wait_for("flag", Duration::ZERO, Duration::ZERO, || {
            false.into_result()
        })
        .unwrap_err();
        assert!(e.ends_with("condition not met"), "{e}");
    }

    #[tokio::test]
    async fn the_async_form_follows_the_same_rule() {
        let mut n = 0;
        let v = until("two", Duration::from_secs(5), || {
            n += 1;
            n >= 2
        })
        .await;
        assert_eq!(v, ());
        let e = wait_for_async("none", Duration::ZERO, POLL, || None::<u8>)
            .await
            .unwrap_err();
        assert!(e.ends_with("nothing yet"), "{e}");
    }
}
