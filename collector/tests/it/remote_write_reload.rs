//! The remote-write output reconfigured live (a reload, `remote_write` module docs, "live"),
//! against the scripted receivers of `remote_write_http`: samples pushed before the swap go
//! to the old endpoints only, samples pushed after to the new ones only, each once; an
//! unchanged endpoint is the same endpoint after the reload; a changed endpoint that cannot
//! deliver counts what it held `reason="reload"` and the sum rule holds throughout; a new
//! endpoint that cannot be set up changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_collector::outputs::remote_write::metrics::{Counters, Dropped, Failed};
use uctel_collector::outputs::remote_write::{self, prompb, RemoteWrite};
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::limits::Limits;

use super::remote_write_http::{batch, config, Scripted};

const T1: i64 = 1_700_000_000_000;
const T2: i64 = 1_700_000_001_000;
const T3: i64 = 1_700_000_002_000;

/// Samples the server received, by timestamp: how many.
fn received(server: &Scripted) -> BTreeMap<i64, u64> {
    let mut out = BTreeMap::new();
    for r in server.seen() {
        for t in prompb::decode_request(&r.body).unwrap().timeseries {
            for s in t.samples {
                *out.entry(s.timestamp).or_default() += 1;
            }
        }
    }
    out
}

fn push(handle: &mut RemoteWrite, n: usize, ts: i64) {
    let payload = batch(n, ts);
    let view = MetricBatchView::decode(&payload, &Limits::default()).unwrap();
    handle.push("a-1", "host-1", 0, &view);
}

/// `in = sent + failed + dropped + pending`.
fn sum_rule(c: &Counters) {
    let dropped: u64 = Dropped::ALL.iter().map(|r| c.dropped(*r)).sum();
    let failed: u64 = Failed::ALL.iter().map(|r| c.failed_count(*r)).sum();
    assert_eq!(
        c.samples_in.get(),
        c.samples_sent() + dropped + failed + u64::try_from(c.pending.get()).unwrap(),
        "sum rule"
    );
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_reload_sends_samples_before_it_to_the_old_endpoint_and_after_it_to_the_new_one() {
    let (a, b) = (
        Scripted::start(vec!["204 No Content"]),
        Scripted::start(vec!["204 No Content"]),
    );
    runtime().block_on(async {
        let registry = prometheus::Registry::new();
        let (trigger, sd) = uctel_common::shutdown::channel();
        let cfgs = [config(a.url())];
        let started =
            remote_write::start(&cfgs, &registry, Duration::from_secs(300), 100_000, &sd).unwrap();
        let mut handle = started.handle;
        // A connection's handle, cloned before the reload, follows it too.
        let mut other = handle.clone();
        push(&mut handle, 10, T1);
        let old = handle.counters(0).unwrap();
        let lines = handle.reconfigure(&[config(b.url())]).unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("added")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("removed")), "{lines:?}");
        push(&mut other, 7, T2);
        push(&mut handle, 3, T3);
        let new = handle.counters(0).unwrap();
        assert!(!Arc::ptr_eq(&old, &new));
        wait_until("both receivers hold their samples", || {
            received(&a).values().sum::<u64>() >= 10 && received(&b).values().sum::<u64>() >= 10
        })
        .await;
        // Long enough for a stray request to arrive.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(received(&a), BTreeMap::from([(T1, 10)]), "old endpoint");
        assert_eq!(
            received(&b),
            BTreeMap::from([(T2, 7), (T3, 3)]),
            "new endpoint"
        );
        assert_eq!((old.samples_in.get(), old.samples_sent()), (10, 10));
        assert_eq!((new.samples_in.get(), new.samples_sent()), (10, 10));
        trigger.trigger();
        for t in started.tasks {
            t.await.unwrap();
        }
        handle.join().await;
        assert_eq!(handle.close(), 0);
        sum_rule(&old);
        sum_rule(&new);
        // The removed endpoint's counters are still exported (they do not start over).
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        let label = format!(
            "uctel_collector_remote_write_samples_total{{url=\"{}\"}} 10",
            a.url()
        );
        assert!(text.contains(&label), "{text}");
    });
}

#[test]
fn an_unchanged_endpoint_is_the_same_endpoint_after_a_reload() {
    let servers: Vec<Scripted> = (0..3)
        .map(|_| Scripted::start(vec!["204 No Content"]))
        .collect();
    runtime().block_on(async {
        let registry = prometheus::Registry::new();
        let (trigger, sd) = uctel_common::shutdown::channel();
        let cfgs = [config(servers[0].url()), config(servers[1].url())];
        let started =
            remote_write::start(&cfgs, &registry, Duration::from_secs(300), 100_000, &sd).unwrap();
        let mut handle = started.handle;
        push(&mut handle, 4, T1);
        let kept = handle.counters(0).unwrap();
        let lines = handle
            .reconfigure(&[config(servers[0].url()), config(servers[2].url())])
            .unwrap();
        assert_eq!(
            lines.len(),
            2,
            "only the removed and the added one: {lines:?}"
        );
        assert!(Arc::ptr_eq(&kept, &handle.counters(0).unwrap()));
        push(&mut handle, 5, T2);
        wait_until("every receiver holds its samples", || {
            received(&servers[0]).values().sum::<u64>() >= 9
                && received(&servers[1]).values().sum::<u64>() >= 4
                && received(&servers[2]).values().sum::<u64>() >= 5
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(received(&servers[0]), BTreeMap::from([(T1, 4), (T2, 5)]));
        assert_eq!(received(&servers[1]), BTreeMap::from([(T1, 4)]));
        assert_eq!(received(&servers[2]), BTreeMap::from([(T2, 5)]));
        trigger.trigger();
        for t in started.tasks {
            t.await.unwrap();
        }
        handle.join().await;
        handle.close();
        sum_rule(&kept);
    });
}

#[test]
fn a_changed_endpoint_that_cannot_deliver_counts_what_it_held_as_reload() {
    let server = Scripted::start(vec!["503 Service Unavailable"]);
    runtime().block_on(async {
        let registry = prometheus::Registry::new();
        let (trigger, sd) = uctel_common::shutdown::channel();
        let mut cfg = config(server.url());
        cfg.timeout_seconds = 0.3;
        let started = remote_write::start(
            &[cfg.clone()],
            &registry,
            Duration::from_secs(300),
            100_000,
            &sd,
        )
        .unwrap();
        let mut handle = started.handle;
        push(&mut handle, 5, T1);
        let c = handle.counters(0).unwrap();
        wait_until("a retry", || c.retried.get() > 0).await;
        // Same url, another queue size: the old endpoint drains, the new one waits for it.
        cfg.queue_capacity_samples = 2000;
        let lines = handle.reconfigure(&[cfg]).unwrap();
        assert!(lines[0].contains("changed"), "{lines:?}");
        push(&mut handle, 3, T2);
        sum_rule(&c);
        wait_until("the old endpoint retired", || {
            c.failed_count(Failed::Reload) + c.dropped(Dropped::Reload) == 5
        })
        .await;
        sum_rule(&c);
        // The new endpoint shares the url's counters: its 3 samples are pending (503).
        assert_eq!(c.samples_in.get(), 8);
        assert_eq!(c.pending.get(), 3);
        assert_eq!(c.failed_count(Failed::Shutdown), 0);
        assert_eq!(c.dropped(Dropped::Shutdown), 0);
        trigger.trigger();
        for t in started.tasks {
            t.await.unwrap();
        }
        handle.join().await;
        handle.close();
        sum_rule(&c);
        assert_eq!(c.pending.get(), 0);
        assert_eq!(
            c.failed_count(Failed::Shutdown) + c.dropped(Dropped::Shutdown),
            3,
            "the new endpoint's samples, at shutdown"
        );
    });
}

#[test]
fn a_new_endpoint_that_cannot_be_set_up_changes_nothing() {
    let server = Scripted::start(vec!["204 No Content"]);
    runtime().block_on(async {
        let registry = prometheus::Registry::new();
        let (trigger, sd) = uctel_common::shutdown::channel();
        let started = remote_write::start(
            &[config(server.url())],
            &registry,
            Duration::from_secs(300),
            100_000,
            &sd,
        )
        .unwrap();
        let mut handle = started.handle;
        let before = handle.counters(0).unwrap();
        let mut broken = config("http://127.0.0.1:9/api/v1/write".into());
        broken.bearer_token_file = Some("/nonexistent/uctel-token".into());
        let e = handle
            .reconfigure(&[config("http://127.0.0.1:9/w".into()), broken])
            .unwrap_err();
        assert!(e.to_string().contains("outputs.remote_write[1]"), "{e}");
        assert!(Arc::ptr_eq(&before, &handle.counters(0).unwrap()));
        assert!(handle.counters(1).is_none());
        push(&mut handle, 2, T1);
        wait_until("the receiver holds the samples", || {
            received(&server).values().sum::<u64>() >= 2
        })
        .await;
        trigger.trigger();
        for t in started.tasks {
            t.await.unwrap();
        }
        handle.join().await;
        handle.close();
        sum_rule(&before);
    });
}
