//! The last error of each output endpoint, for the status API (`crate::status`): what an
//! operator asks first when an output's pending count grows. Noted where the senders log
//! their events (every event that carries an error, whether or not its line is logged or
//! rate-limited), by endpoint: a remote-write endpoint's URL without credentials (its `url`
//! label), [`CLICKHOUSE`] for the ClickHouse output.
//!
//! Process-wide (the endpoints are the configuration's, a few per collector) and bounded
//! ([`MAX_ENDPOINTS`]: the endpoint noted longest ago is forgotten first).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use super::sender::Event;

/// The key of the ClickHouse output (one per collector).
pub const CLICKHOUSE: &str = "clickhouse";

/// Most endpoints remembered.
pub const MAX_ENDPOINTS: usize = 256;

static LAST: Mutex<BTreeMap<String, (SystemTime, String)>> = Mutex::new(BTreeMap::new());

fn last() -> std::sync::MutexGuard<'static, BTreeMap<String, (SystemTime, String)>> {
    LAST.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The error `event` carries, if any.
pub(crate) fn of(event: &Event<'_>) -> Option<String> {
    match event {
        Event::Retry { why, .. }
        | Event::GaveUp { why, .. }
        | Event::Unchecked { why, .. }
        | Event::Unknown { why, .. }
        | Event::CheckFailed { why, .. }
        | Event::NotEncoded { why, .. } => Some((*why).to_owned()),
        Event::ItemRefused { refused } | Event::PartRefused { refused, .. } => {
            Some(refused.why.clone())
        }
        Event::Landed { .. } | Event::Isolated { .. } | Event::NotSent { .. } => None,
    }
}

/// Notes the error of `event` (if it carries one) as `endpoint`'s last.
pub(crate) fn note(endpoint: &str, event: &Event<'_>) {
    let Some(why) = of(event) else { return };
    let mut m = last();
    if !m.contains_key(endpoint) && m.len() >= MAX_ENDPOINTS {
        let oldest = m
            .iter()
            .min_by_key(|(_, (t, _))| *t)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            m.remove(&k);
        }
    }
    m.insert(endpoint.to_owned(), (SystemTime::now(), why));
}

/// `endpoint`'s last error and when it was noted; `None` when it has had none.
pub fn get(endpoint: &str) -> Option<(SystemTime, String)> {
    last().get(endpoint).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_of_an_endpoint_is_kept() {
        let url = "http://last-error.test/write";
        assert!(get(url).is_none());
        note(url, &Event::Landed { items: 1 });
        assert!(
            get(url).is_none(),
            "an event without an error notes nothing"
        );
        note(
            url,
            &Event::GaveUp {
                items: 3,
                why: "HTTP 503",
            },
        );
        note(
            url,
            &Event::Retry {
                items: 3,
                why: "connection refused",
                delay: std::time::Duration::from_secs(1),
            },
        );
        assert_eq!(
            get(url).map(|(_, w)| w).as_deref(),
            Some("connection refused")
        );
    }
}
