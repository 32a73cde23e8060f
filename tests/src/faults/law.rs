//! The conservation law a row is judged by ([`Row::verdict`]): per agent and stream,
//! `written = delivered + lost + dropped` (records) and `sent = received + lost + dropped`
//! (frames, for every stream of [`STREAMS`]), for an agent running `sources.fast_counters`
//! the sample law of [`super::samples`], the collector's copy of the agent's drop counters
//! (`uctel_collector_agent_*_dropped_total`, from its heartbeats) at least the agent's own,
//! nothing delivered twice, no panic, bounded memory, `/metrics` still served. A failing row
//! panics with the seed and a table of every term.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::exposition::Scrape;
use crate::pipeline::{strip_ansi, CollectorFigures, STREAMS};

// The sibling modules, re-exported by `faults`.
use super::*;

impl Row {
    /// Judges the row (see the module docs) and panics with the table on failure; prints
    /// the table in any case. The collector is stopped with SIGTERM at the end.
    ///
    /// # Panics
    /// When any check failed.
    pub fn verdict(&mut self, law: Law) {
        let delivered = Delivered::read(&self.sink, &self.name, self.seed);
        let mut out = String::new();
        let mut failures = std::mem::take(&mut self.failures);
        let _ = writeln!(
            out,
            "==== row={} seed={:#x} law={law:?} run {:.1?}",
            self.name,
            self.seed,
            self.started.elapsed()
        );
        let ids: Vec<String> = {
            let mut seen = BTreeSet::new();
            self.agents
                .iter()
                .map(|a| a.spec.id.clone())
                .filter(|id| seen.insert(id.clone()))
                .collect()
        };
        let collector_final = self
            .collector_lives
            .last()
            .and_then(|l| l.last.clone())
            .unwrap_or_default();
        for id in &ids {
            self.records_law(id, law, &delivered, &mut out, &mut failures);
            self.frames_law(id, &collector_final, &mut out, &mut failures);
            self.agent_counters_law(id, &collector_final, &mut out, &mut failures);
        }
        for i in 0..self.agents.len() {
            if self.runs_fast_counters(i) {
                self.samples_law(i, &mut out, &mut failures);
            }
        }
        if delivered.mismatched_count > 0 {
            failures.push(format!(
                "{} delivered records differ from the line written, e.g. {:?}",
                delivered.mismatched_count, delivered.mismatched
            ));
        }
        if delivered.torn_count > 0 {
            failures.push(format!(
                "{} lines of the sink are not whole JSON records, e.g. {:?}",
                delivered.torn_count, delivered.torn
            ));
        }
        let refused: u64 = self
            .collector_lives
            .iter()
            .filter_map(|l| l.last.as_ref())
            .map(|s| {
                s.count(
                    "uctel_collector_handshakes_refused_total",
                    &[("reason", "duplicate_agent_id")],
                )
            })
            .sum();
        if refused > 0 {
            let _ = writeln!(out, "  handshakes refused as duplicate_agent_id: {refused}");
            if !self.allow.duplicate_refusals {
                failures.push(format!(
                    "{refused} handshake(s) refused as duplicate_agent_id although every agent has its own id (an agent restarted after its Goodbye was taken for a second live agent and kept out for a backoff)"
                ));
            }
        }
        if self.mono.violation_count > 0 {
            failures.push(format!(
                "{} counter decreases between scrapes of one process: {:?}",
                self.mono.violation_count, self.mono.violations
            ));
        }
        let mut logs = vec![("collector".to_owned(), self.collector.log())];
        for a in &self.agents {
            logs.push((a.spec.name.clone(), a.daemon.log()));
        }
        for (name, log) in &logs {
            if let Some(l) = log.lines().find(|l| l.contains("panicked")) {
                failures.push(format!("{name} panicked: {}", strip_ansi(l)));
            }
        }
        let _ = writeln!(
            out,
            "  scrapes {} (counters monotonic: {}); memory: {}",
            self.mono.scrapes,
            self.mono.violation_count == 0,
            self.memory
                .iter()
                .map(|(p, (rss, hwm))| format!("{p} rss {rss} KiB peak {hwm} KiB"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for n in &self.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        if self.collector.is_running() {
            self.collector.signal(Signal::SIGTERM);
            match self.collector.wait_exit(Duration::from_secs(20)) {
                Some(st) if st.success() => {}
                other => failures.push(format!("collector: unclean exit after SIGTERM: {other:?}")),
            }
        }
        eprint!("{out}");
        if !failures.is_empty() {
            let mut tails = self.collector.log_tail(25);
            for a in &self.agents {
                tails.push('\n');
                tails.push_str(&a.daemon.log_tail(15));
            }
            panic!(
                "row={} seed={:#x}: {} check(s) failed:\n- {}\n{out}\n{tails}",
                self.name,
                self.seed,
                failures.len(),
                failures.join("\n- ")
            );
        }
    }

    /// `written = delivered + lost + dropped` for the log records of agent id `id`.
    fn records_law(
        &self,
        id: &str,
        law: Law,
        delivered: &Delivered,
        out: &mut String,
        failures: &mut Vec<String>,
    ) {
        let agents: Vec<&RowAgent> = self.agents.iter().filter(|a| a.spec.id == id).collect();
        let written: u64 = agents.iter().map(|a| a.written()).sum();
        let mut distinct = 0;
        let mut dups = 0;
        let mut beyond = 0;
        let mut repeated = Vec::new();
        for a in &agents {
            for s in &a.sources {
                distinct += delivered.distinct(id, &s.src);
                dups += delivered.duplicates(id, &s.src);
                beyond += delivered.beyond(id, &s.src, s.written);
                repeated.extend(
                    delivered
                        .repeated_examples(id, &s.src)
                        .into_iter()
                        .map(|q| format!("{}#{q}", s.src)),
                );
            }
        }
        // Collector terms, every life.
        let m = [("agent", id), ("stream", "logs")];
        let mut lost = 0;
        let mut sink_dropped = 0;
        let mut unknown_bound: Option<u64> = None;
        for life in &self.collector_lives {
            let Some(s) = &life.last else { continue };
            lost += s.count("uctel_collector_records_lost_total", &m);
            sink_dropped += s.count(
                "uctel_collector_records_dropped_total",
                &[("agent", id), ("reason", "log_sink_error")],
            );
            if let Some(v) = unknown_tail(s, "uctel_collector_", Some(id)) {
                *unknown_bound.get_or_insert(0) += v;
            }
        }
        for a in &agents {
            for life in &a.lives {
                if let Some(v) = life
                    .last
                    .as_ref()
                    .and_then(|s| unknown_tail(s, "uctel_agent_", None))
                {
                    *unknown_bound.get_or_insert(0) += v;
                }
            }
        }
        // Agent terms, every life of every agent with this id. A life that was followed by
        // another re-reads what it dropped at `shutdown` (not settled), so only the last
        // life's `shutdown` drops are final.
        let mut agent_dropped: BTreeMap<String, u64> = BTreeMap::new();
        for a in &agents {
            let n = a.lives.len();
            for (k, life) in a.lives.iter().enumerate() {
                let Some(s) = &life.last else { continue };
                for smp in s.select("uctel_agent_records_dropped_total", &[("stream", "logs")]) {
                    let Some(reason) = smp.label("reason") else {
                        continue;
                    };
                    if reason == "shutdown" && k + 1 < n {
                        continue;
                    }
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let v = smp.value.max(0.0).round() as u64;
                    *agent_dropped.entry(reason.to_owned()).or_default() += v;
                }
            }
        }
        let agent_total: u64 = agent_dropped.values().sum();
        // Lines the agents read (every life; lines re-read after a restart count twice).
        let mut read = 0;
        let mut unread = 0;
        for a in &agents {
            let r: u64 = a
                .lives
                .iter()
                .filter_map(|l| l.last.as_ref())
                .map(|s| s.count("uctel_agent_log_records_read_total", &[]))
                .sum();
            read += r;
            unread += a.written().saturating_sub(r);
        }
        let unread_term = if self.allow.unread { unread } else { 0 };
        let sum = distinct + lost + sink_dropped + agent_total + unread_term;
        let verdict = match law {
            Law::Exact if sum == written => "ok".to_owned(),
            Law::AtMost if sum <= written => {
                format!("ok (at most; {} unaccounted)", written - sum)
            }
            _ => format!("MISMATCH ({:+})", i128::from(sum) - i128::from(written)),
        };
        let _ = writeln!(
            out,
            "  agent {id}, stream logs, records: written = delivered + lost + dropped"
        );
        let mut t = Table::default();
        t.row("written by the source (expected)", written, "");
        t.row("delivered to the sink (distinct)", distinct, "");
        t.row("lost (collector records_lost_total)", lost, "");
        t.row("dropped collector{log_sink_error}", sink_dropped, "");
        for (r, v) in &agent_dropped {
            if *v > 0 {
                t.row(&format!("dropped agent{{{r}}}"), *v, "");
            }
        }
        if self.allow.unread {
            t.row("never read by a kept-out agent (in its file)", unread, "");
        }
        t.row("delivered + lost + dropped", sum, &verdict);
        t.row(
            "delivered twice (extra copies)",
            dups,
            if dups == 0 { "ok" } else { "FAIL" },
        );
        if beyond > 0 {
            t.row("delivered but never written", beyond, "FAIL");
        }
        t.row("(read by the agent, log_records_read_total)", read, "");
        out.push_str(&t.render());
        if !verdict.starts_with("ok") {
            failures.push(format!(
                "agent {id} logs: delivered {distinct} + lost {lost} + dropped {} = {sum}, written {written}",
                sink_dropped + agent_total
            ));
        }
        if dups > 0 {
            failures.push(format!(
                "agent {id} logs: {dups} lines delivered more than once, e.g. {repeated:?}"
            ));
        }
        if beyond > 0 {
            failures.push(format!(
                "agent {id} logs: {beyond} delivered lines were never written"
            ));
        }
        if law == Law::AtMost {
            let unaccounted = written.saturating_sub(sum);
            match unknown_bound {
                Some(b) if unaccounted > b => failures.push(format!(
                    "agent {id} logs: {unaccounted} records unaccounted, above the {b} the collector reported unknown"
                )),
                Some(b) => {
                    let _ = writeln!(
                        out,
                        "    unaccounted {unaccounted} <= reported unknown {b}"
                    );
                }
                // No collector metric reports the unknown tail of a session that ended
                // without Goodbye yet (DESIGN.md §6 asks for it): only the inequality holds.
                None => {
                    let _ = writeln!(
                        out,
                        "    unaccounted {unaccounted}: no metric reports the unknown tail of a session without Goodbye (only the inequality is asserted)"
                    );
                }
            }
        }
    }

    /// The agent's drops as the collector exports them from its heartbeats
    /// (`uctel_collector_agent_{frames,records}_dropped_total{agent,stream,reason}`): for an
    /// agent id with one agent process and one collector process whose every session ended
    /// with a Goodbye (the agent sends its counters in a last heartbeat before it), per
    /// stream and reason at least the agent's own `uctel_agent_*_dropped_total` at its last
    /// scrape (the agent may still drop after it, as `shutdown`). Other rows print the
    /// figures only.
    fn agent_counters_law(
        &self,
        id: &str,
        collector: &Scrape,
        out: &mut String,
        failures: &mut Vec<String>,
    ) {
        let agents: Vec<&RowAgent> = self.agents.iter().filter(|a| a.spec.id == id).collect();
        let [agent] = agents.as_slice() else {
            return;
        };
        let Some(last) = agent.lives.last().and_then(|l| l.last.as_ref()) else {
            return;
        };
        let ended = |reason: &str| {
            collector.count(
                "uctel_collector_sessions_ended_total",
                &[("agent", id), ("reason", reason)],
            )
        };
        let goodbyes = ended("goodbye");
        let other = ended("no_goodbye") + ended("replaced") + ended("shutdown");
        let judged =
            agent.lives.len() == 1 && self.collector_lives.len() == 1 && goodbyes > 0 && other == 0;
        let mut short = Vec::new();
        let (mut at_agent, mut at_collector) = (0, 0);
        for kind in ["frames", "records"] {
            let name = format!("uctel_agent_{kind}_dropped_total");
            for smp in last.select(&name, &[]) {
                let (Some(stream), Some(reason)) = (smp.label("stream"), smp.label("reason"))
                else {
                    continue;
                };
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let a = smp.value.max(0.0).round() as u64;
                let c = collector.count(
                    &format!("uctel_collector_agent_{kind}_dropped_total"),
                    &[("agent", id), ("stream", stream), ("reason", reason)],
                );
                if kind == "records" {
                    at_agent += a;
                    at_collector += c;
                }
                if c < a {
                    short.push(format!(
                        "{kind} {stream}/{reason}: collector {c} < agent {a}"
                    ));
                }
            }
        }
        let verdict = match (judged, short.is_empty()) {
            (false, _) => "not judged (restarts or sessions without Goodbye)",
            (true, true) => "ok",
            (true, false) => "MISMATCH",
        };
        let _ = writeln!(
            out,
            "  agent {id} drops at the collector (heartbeats): records {at_collector} >= agent's last scrape {at_agent}: {verdict}"
        );
        if judged && !short.is_empty() {
            failures.push(format!(
                "agent {id}: the collector's uctel_collector_agent_*_dropped_total is below the agent's own counters: {}",
                short.join("; ")
            ));
        }
    }

    /// Per stream `sent = received + lost + dropped` (frames and records) for the sessions
    /// of `id` logged since the frame baseline, against the collector's figures since then.
    fn frames_law(
        &self,
        id: &str,
        collector: &Scrape,
        out: &mut String,
        failures: &mut Vec<String>,
    ) {
        let mut goodbyes: Vec<BTreeMap<String, u64>> = Vec::new();
        let mut lost_sessions = 0;
        for a in self.agents.iter().filter(|a| a.spec.id == id) {
            let log = a.daemon.log();
            let tail = log.get(a.log_mark..).unwrap_or("");
            goodbyes.extend(goodbye_lines(tail));
            lost_sessions += tail
                .lines()
                .filter(|l| l.contains("connection to the collector lost"))
                .count();
        }
        let clog = self.collector.log();
        let ctail = clog.get(self.collector_log_mark..).unwrap_or("");
        let sessions = welcomed_sessions(ctail, id);
        let fin = CollectorFigures::read(collector, id);
        let base = self
            .frame_base
            .as_ref()
            .map(|s| CollectorFigures::read(s, id))
            .unwrap_or_default();
        let sum_key = |k: &str| -> u64 { goodbyes.iter().filter_map(|g| g.get(k)).sum() };
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let after = d(fin.dropped_after_tracking(), base.dropped_after_tracking());
        let exact = sessions == goodbyes.len();
        let excused = sessions <= goodbyes.len() + self.allow.sessions_without_goodbye;
        let _ = writeln!(
            out,
            "  agent {id}, frames per stream: sessions since the baseline {sessions} at the collector, {} with Goodbye, {lost_sessions} lost by the agent{}",
            goodbyes.len(),
            if exact { "" } else { " (not all accounted: rule not exact)" }
        );
        if !excused {
            failures.push(format!(
                "agent {id}: the collector saw {sessions} sessions since the baseline, {} ended with Goodbye: sessions ended without Goodbye in a row where none should",
                goodbyes.len()
            ));
        }
        let mut t = Table::default();
        t.header(&[
            "stream",
            "sent",
            "received",
            "lost",
            "drop-after",
            "sum",
            "records sent",
            "rec received",
            "rec lost",
            "rec replayed",
            "",
        ]);
        let mut sent_total = 0;
        let mut seen_total = 0;
        for s in STREAMS {
            let sent = sum_key(&format!("{s}_frames"));
            let rx = d(fin.received[s], base.received.get(s).copied().unwrap_or(0));
            let lost = d(fin.lost[s], base.lost.get(s).copied().unwrap_or(0));
            let rsent = sum_key(&format!("{s}_records"));
            let rrx = d(
                fin.records_received[s],
                base.records_received.get(s).copied().unwrap_or(0),
            );
            let rlost = d(
                fin.records_lost[s],
                base.records_lost.get(s).copied().unwrap_or(0),
            );
            // Log records sent again after a restart, discarded by the collector (README
            // "Loss accounting"): records of received frames, in no other counter.
            let replayed = |sc: &Scrape| {
                sc.count(
                    "uctel_collector_records_replayed_total",
                    &[("agent", id), ("stream", s)],
                )
            };
            let rrep = d(
                replayed(collector),
                self.frame_base.as_ref().map_or(0, replayed),
            );
            sent_total += sent;
            seen_total += rx + lost;
            let frames_ok = rx + lost <= sent && sent <= rx + lost + after;
            let records_ok = after > 0 || rsent == rrx + rlost + rrep;
            let ok = frames_ok && records_ok;
            t.cells(&[
                s.to_owned(),
                sent.to_string(),
                rx.to_string(),
                lost.to_string(),
                after.to_string(),
                (rx + lost).to_string(),
                rsent.to_string(),
                rrx.to_string(),
                rlost.to_string(),
                rrep.to_string(),
                if ok { "ok".into() } else { "MISMATCH".into() },
            ]);
            if exact && !frames_ok {
                failures.push(format!(
                    "agent {id} stream {s}: frames sent {sent} != received {rx} + lost {lost} (+ up to {after} dropped after tracking)"
                ));
            }
            if exact && !records_ok {
                failures.push(format!(
                    "agent {id} stream {s}: records sent {rsent} != received {rrx} + lost {rlost} + replayed {rrep}"
                ));
            }
        }
        out.push_str(&t.render());
        let conn_sent = sum_key("frames");
        let rx_all = d(fin.received_total(), base.received_total());
        let dropped = d(fin.dropped_total(), base.dropped_total());
        let conn_lost = d(fin.connection_lost, base.connection_lost);
        let conn_ok = conn_sent == rx_all + dropped + conn_lost;
        let streams_ok = sent_total == seen_total + after;
        let _ = writeln!(
            out,
            "    connection: sent {conn_sent} = received {rx_all} + dropped {dropped} + connection_lost {conn_lost}: {}; streams: sent {sent_total} = received+lost {seen_total} + dropped after tracking {after}: {}",
            if conn_ok { "ok" } else { "MISMATCH" },
            if streams_ok { "ok" } else { "MISMATCH" }
        );
        let mut reasons: Vec<String> = fin
            .dropped
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(r, v)| format!("{r}={v}"))
            .collect();
        for (name, label) in [
            ("uctel_collector_frames_late_total", "late"),
            ("uctel_collector_frames_duplicate_total", "duplicate"),
            ("uctel_collector_frames_stale_total", "stale"),
        ] {
            let v = collector.count(name, &[("agent", id)]);
            if v > 0 {
                reasons.push(format!("{label}={v}"));
            }
        }
        let faults = sum_key("fault_dropped");
        if !reasons.is_empty() || faults > 0 {
            let _ = writeln!(
                out,
                "    collector frames dropped/late/duplicate: {}; agent fault injector dropped {faults}",
                reasons.join(" ")
            );
        }
        if exact && !conn_ok {
            failures.push(format!(
                "agent {id}: connection sent {conn_sent} != received {rx_all} + dropped {dropped} + connection_lost {conn_lost}"
            ));
        }
        if exact && !streams_ok {
            failures.push(format!(
                "agent {id}: frames sent {sent_total} != received+lost {seen_total} + dropped after tracking {after}"
            ));
        }
    }

    /// The sample law (`super::samples` module docs) for agent `i`, into the verdict's table and failures.
    fn samples_law(&self, i: usize, out: &mut String, failures: &mut Vec<String>) {
        let a = &self.agents[i];
        let (name, id) = (a.spec.name.as_str(), a.spec.id.as_str());
        let f = self.sample_figures(i);
        let _ = writeln!(
            out,
            "  agent {name} ({id}), stream fast_counters, samples over the whole run ({} of {} lives stopped cleanly):",
            f.stopped_lives,
            a.lives.len()
        );
        let whole = f.stopped_lives == a.lives.len();
        if !whole {
            failures.push(format!(
                "agent {name} fast_counters: {} of {} lives logged `fast_counters: stopped` (the source did not run or the agent did not stop cleanly)",
                f.stopped_lives,
                a.lives.len()
            ));
        }
        let agent_ok = f.taken == f.sent + f.dropped;
        let one_span = self.collector_lives.len() == 1
            && self.frame_base.is_none()
            && self.agents.iter().filter(|b| b.spec.id == id).count() == 1
            && a.lives.len() == 1;
        let collector_ok = f.sent == f.received + f.lost;
        let mut t = Table::default();
        t.row("samples taken (agent, samples_taken)", f.taken, "");
        t.row("records sent (agent, whole run)", f.sent, "");
        t.row("records dropped (agent, whole run)", f.dropped, "");
        for (r, v) in &f.dropped_by_reason {
            if *v > 0 {
                t.row(
                    &format!("  of which agent{{{r}}} by the last scrape"),
                    *v,
                    "",
                );
            }
        }
        let by_reason: u64 = f.dropped_by_reason.values().sum();
        if f.dropped > by_reason {
            t.row(
                "  of which after the last scrape (shutdown)",
                f.dropped - by_reason,
                "",
            );
        }
        t.row(
            "sent + dropped",
            f.sent + f.dropped,
            if agent_ok { "ok" } else { "MISMATCH" },
        );
        t.row(
            "received (collector records_received_total)",
            f.received,
            "",
        );
        t.row("lost (collector records_lost_total)", f.lost, "");
        t.row(
            "received + lost (= sent)",
            f.received + f.lost,
            match (one_span, collector_ok) {
                (true, true) => "ok",
                (true, false) => "MISMATCH",
                (false, _) => "(spans differ: per epoch only)",
            },
        );
        for (r, v) in &f.errors_by_reason {
            t.row(&format!("source errors {{{r}}} by the last scrape"), *v, "");
        }
        t.row("missed rounds", f.missed_rounds, "");
        out.push_str(&t.render());
        if whole && !agent_ok {
            failures.push(format!(
                "agent {name} fast_counters: samples taken {} != sent {} + dropped {}",
                f.taken, f.sent, f.dropped
            ));
        }
        if whole && one_span && !collector_ok {
            failures.push(format!(
                "agent {name} fast_counters: samples sent {} != collector received {} + lost {}",
                f.sent, f.received, f.lost
            ));
        }
    }
}

/// A plain text table for the verdict.
#[derive(Debug, Default)]
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn header(&mut self, cells: &[&str]) {
        self.rows
            .push(cells.iter().map(|c| (*c).to_owned()).collect());
    }

    fn cells(&mut self, cells: &[String]) {
        self.rows.push(cells.to_vec());
    }

    fn row(&mut self, term: &str, value: u64, verdict: &str) {
        self.rows
            .push(vec![term.to_owned(), value.to_string(), verdict.to_owned()]);
    }

    fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut width = vec![0; cols];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut s = String::new();
        for r in &self.rows {
            s.push_str("    ");
            for (i, c) in r.iter().enumerate() {
                let pad = width[i] - c.chars().count();
                if i > 0 && c.chars().all(|ch| ch.is_ascii_digit()) && !c.is_empty() {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                }
                s.push_str("  ");
            }
            s.truncate(s.trim_end().len());
            s.push('\n');
        }
        s
    }
}
