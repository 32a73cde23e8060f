//! The outputs' sum rules, checked on every collector scrape a row records
//! ([`super::Row::scrape_collector`]): what an output took in is sent, dropped, failed or
//! pending, at every instant, not only at quiescence.

use std::collections::BTreeSet;

use crate::exposition::Scrape;

/// The outputs' sum rules on one collector scrape: per remote-write endpoint
/// `samples_in = samples + Σ dropped + Σ failed + pending`, and for ClickHouse
/// `rows_in = rows_inserted + Σ rows_dropped + rows_pending`, and per OTLP signal
/// `items_in = items_sent + Σ items_dropped + items_pending`. Returns what does not add up
/// (nothing when no output is configured).
pub fn output_sum_failures(s: &Scrape) -> Vec<String> {
    const RW: &str = "uctel_collector_remote_write_";
    const CH: &str = "uctel_collector_clickhouse_";
    let mut out = Vec::new();
    let urls: BTreeSet<String> = s
        .select(&format!("{RW}samples_in_total"), &[])
        .filter_map(|x| x.label("url").map(str::to_owned))
        .collect();
    for url in &urls {
        let m = [("url", url.as_str())];
        let get = |name: &str| s.count(&format!("{RW}{name}"), &m);
        let (input, sent, dropped, failed, pending) = (
            get("samples_in_total"),
            get("samples_total"),
            get("samples_dropped_total"),
            get("samples_failed_total"),
            get("samples_pending"),
        );
        if input != sent + dropped + failed + pending {
            out.push(format!(
                "remote-write {url}: samples_in {input} ≠ sent {sent} + dropped {dropped} + \
                 failed {failed} + pending {pending}"
            ));
        }
    }
    if s.has(&format!("{CH}rows_in_total"), &[]) {
        let get = |name: &str| s.count(&format!("{CH}{name}"), &[]);
        let (input, inserted, dropped, pending) = (
            get("rows_in_total"),
            get("rows_inserted_total"),
            get("rows_dropped_total"),
            get("rows_pending"),
        );
        if input != inserted + dropped + pending {
            out.push(format!(
                "clickhouse: rows_in {input} ≠ inserted {inserted} + dropped {dropped} + \
                 pending {pending}"
            ));
        }
    }
    const OT: &str = "uctel_collector_otlp_";
    let signals: BTreeSet<String> = s
        .select(&format!("{OT}items_in_total"), &[])
        .filter_map(|x| x.label("signal").map(str::to_owned))
        .collect();
    for signal in &signals {
        let m = [("signal", signal.as_str())];
        let get = |name: &str| s.count(&format!("{OT}{name}"), &m);
        let (input, sent, dropped, pending) = (
            get("items_in_total"),
            get("items_sent_total"),
            get("items_dropped_total"),
            get("items_pending"),
        );
        if input != sent + dropped + pending {
            out.push(format!(
                "otlp {signal}: items_in {input} ≠ sent {sent} + dropped {dropped} + \
                 pending {pending}"
            ));
        }
    }
    out
}
