//! The two payload forms side by side (`--only soft`, issue 43): the soft path run with
//! protobuf metrics frames (`kind = metrics`) and with series-dictionary frames
//! (`kind = metrics_dict`, steady state, negotiated at `Hello` as the agent does,
//! [`crate::loadgen`]) at the same frame size, alternated back to back in one run (ABBA:
//! metrics, metrics_dict, then metrics_dict, metrics, …), each run with a fresh collector.
//!
//! The figure is collector samples per CPU second; the ratio pools every round of each form
//! (`Σ samples ÷ Σ collector CPU-s`), and each round's own ratio is kept so the spread under
//! a loaded machine shows.

use serde::Serialize;

use crate::softpath::SoftRunResult;
use crate::stats::{ratio, si, Goal, Target, Verdict};
use crate::workload::FrameForm;

/// Series-dictionary samples per collector CPU-s at least this multiple of the protobuf
/// form's at the same frame size (issue 43).
pub const DICT_VS_METRICS_PER_CORE: f64 = 3.0;

/// One round: both forms, back to back.
#[derive(Clone, Debug, Serialize)]
pub struct FormRound {
    /// Which form ran first.
    pub first: FrameForm,
    /// The protobuf run.
    pub metrics: SoftRunResult,
    /// The series-dictionary run.
    pub metrics_dict: SoftRunResult,
}

impl FormRound {
    /// This round's `metrics_dict ÷ metrics` samples per collector CPU-s.
    pub fn ratio(&self) -> f64 {
        ratio(
            self.metrics_dict.samples_per_core_sec,
            self.metrics.samples_per_core_sec,
        )
    }
}

/// Every round of the soft path's form comparison.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoftForms {
    /// The rounds, in the order they ran.
    pub rounds: Vec<FormRound>,
}

/// Pooled figures of one form: (samples, collector CPU-s, wall s).
fn pooled<'a>(runs: impl Iterator<Item = &'a SoftRunResult>) -> (f64, f64, f64) {
    runs.fold((0.0, 0.0, 0.0), |(s, c, w), r| {
        (
            s + r.samples,
            c + r.collector_cpu.cpu_seconds,
            w + r.collector_cpu.wall_seconds,
        )
    })
}

impl SoftForms {
    fn runs(&self, form: FrameForm) -> impl Iterator<Item = &SoftRunResult> {
        self.rounds.iter().map(move |r| match form {
            FrameForm::Metrics => &r.metrics,
            FrameForm::MetricsDict => &r.metrics_dict,
        })
    }

    /// Pooled samples per collector CPU-s of `form` over every round.
    pub fn samples_per_core_sec(&self, form: FrameForm) -> f64 {
        let (s, c, _) = pooled(self.runs(form));
        ratio(s, c)
    }

    /// Pooled `metrics_dict ÷ metrics` samples per collector CPU-s.
    pub fn ratio(&self) -> f64 {
        ratio(
            self.samples_per_core_sec(FrameForm::MetricsDict),
            self.samples_per_core_sec(FrameForm::Metrics),
        )
    }

    /// Worst `unaccounted` (frames, then records) over every run: 0 when exact.
    pub fn worst_unaccounted(&self) -> (f64, f64) {
        self.rounds
            .iter()
            .flat_map(|r| [&r.metrics, &r.metrics_dict])
            .fold((0.0f64, 0.0f64), |(f, s), r| {
                (
                    f.max(r.accounting.unaccounted.abs()),
                    s.max(r.accounting.records_unaccounted.abs()),
                )
            })
    }

    /// The report's rows.
    pub fn rows(&self) -> Vec<[String; 4]> {
        let Some(first) = self.rounds.first() else {
            return Vec::new();
        };
        let mut rows = vec![[
            format!(
                "soft path by form, K = {}, ≤ {} B frames, {} rounds alternated",
                first.metrics.agents,
                first.metrics.frame_bytes.max(first.metrics_dict.frame_bytes),
                self.rounds.len()
            ),
            format!(
                "metrics {} samples per collector CPU-s ({} per frame); metrics_dict {} ({} per frame)",
                si(self.samples_per_core_sec(FrameForm::Metrics)),
                first.metrics.records_per_frame,
                si(self.samples_per_core_sec(FrameForm::MetricsDict)),
                first.metrics_dict.records_per_frame
            ),
            format!(
                "metrics_dict/metrics {:.2}× pooled; rounds {}",
                self.ratio(),
                self.rounds
                    .iter()
                    .map(|r| format!("{:.2}", r.ratio()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            {
                let (f, s) = self.worst_unaccounted();
                format!("unaccounted frames {f}, records {s} (worst run)")
            },
        ]];
        for r in &self.rounds {
            for s in [&r.metrics, &r.metrics_dict] {
                rows.push([
                    format!(
                        "  {} ({} B steady frames, {} samples each)",
                        s.form.name(),
                        s.steady_frame_bytes,
                        s.records_per_frame
                    ),
                    format!(
                        "{} frames/s, {} samples/s; {:.2} collector cores",
                        si(s.frames_per_sec),
                        si(s.samples_per_sec),
                        s.collector_cpu.cores
                    ),
                    format!(
                        "{} frames, {} samples per collector CPU-s",
                        si(s.frames_per_core_sec),
                        si(s.samples_per_core_sec)
                    ),
                    format!(
                        "sent {} = received {} + lost {}; records {} = {} + {}",
                        s.accounting.sent,
                        s.accounting.received,
                        s.accounting.lost,
                        s.accounting.records_sent,
                        s.accounting.records_received,
                        s.accounting.records_lost
                    ),
                ]);
            }
        }
        rows
    }

    /// The targets: the ratio, and exact accounting in both forms.
    pub fn targets(&self) -> Vec<Target> {
        if self.rounds.is_empty() {
            return Vec::new();
        }
        let (frames, records) = self.worst_unaccounted();
        vec![
            Target {
                name: "soft path samples per collector CPU-s, metrics_dict vs metrics (same frame size)".into(),
                rule: format!("≥ {DICT_VS_METRICS_PER_CORE} × metrics (issue 43)"),
                verdict: Verdict::check(self.ratio(), DICT_VS_METRICS_PER_CORE, Goal::AtLeast),
            },
            Target {
                name: "soft path by form: every frame and record accounted for".into(),
                rule: "sent − received − lost = 0, frames and records, every run".into(),
                verdict: Verdict::check(frames.max(records), 0.0, Goal::AtMost),
            },
        ]
    }
}
