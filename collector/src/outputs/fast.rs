//! What the collector makes of the agents' high-frequency sample series (`fast_counters`
//! stream, `uctel_protocol::samples`): per series, the last second of samples, from which
//!
//! - the **latest value** goes to the series store (`/metrics`) under the series' own name;
//! - a counter's **rate over the last second** goes to the store as the gauge
//!   `<name without _total>_per_second` (a gauge in the base unit per second, so not a
//!   `:`-named recording-rule series, which `promtool check metrics` flags):
//!   `(v_newest − v_oldest) / (t_newest − t_oldest)` over the samples
//!   of the last second (the newest at most 1 s after the oldest). A counter that goes down
//!   (a reset) starts its window again at the lower value, as `rate()` treats a reset;
//! - **every sample with its own timestamp** goes to remote-write. Remote-write timestamps
//!   are milliseconds and must increase within a series: a sample whose millisecond is not
//!   after the previous one sent for that series (two samples less than 1 ms apart) is sent
//!   1 ms after it, so no sample is rejected as out of order or duplicate.
//!
//! A series whose last sample is Prometheus's stale marker (the agent ended it: the pod
//! that owned its device ended, `uctel_agent::sources::pod_resources`) ends here: its
//! window is forgotten, the marker goes to the store (which removes the series) and to
//! remote-write (which ends it there), and its rate series is ended in the store too
//! ([`Observed::ended`]).
//!
//! State is kept per agent for at most [`MAX_SERIES_PER_AGENT`] series; beyond it a series
//! still has its latest value and remote-write samples, without a rate.

use std::collections::{HashMap, VecDeque};

use uctel_protocol::payload::{Label, Metric, MetricType};
use uctel_protocol::samples::SampleSeries;

/// The window a rate is computed over, µs.
pub const RATE_WINDOW_US: i64 = 1_000_000;
/// Most series per agent with a rate window.
pub const MAX_SERIES_PER_AGENT: usize = 4096;
/// Suffix of the rate series.
pub const RATE_SUFFIX: &str = "_per_second";

/// Prometheus's stale-marker NaN (`model/value.StaleNaN`).
const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// One series' recent samples.
#[derive(Debug, Default)]
struct Window {
    /// `(µs since the Unix epoch, value)`, oldest first, spanning at most
    /// [`RATE_WINDOW_US`].
    samples: VecDeque<(i64, f64)>,
    /// The last remote-write timestamp sent, ms.
    last_ms: i64,
}

impl Window {
    fn add(&mut self, t_us: i64, v: f64, counter: bool) {
        if counter && self.samples.back().is_some_and(|&(_, last)| v < last) {
            self.samples.clear();
        }
        self.samples.push_back((t_us, v));
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| t_us.saturating_sub(t) > RATE_WINDOW_US)
        {
            self.samples.pop_front();
        }
    }

    fn rate(&self) -> Option<f64> {
        let (&(t0, v0), &(t1, v1)) = (self.samples.front()?, self.samples.back()?);
        (t1 > t0).then(|| (v1 - v0) / ((t1 - t0) as f64 / 1e6))
    }

    /// Appends one [`Metric`] per sample of `s` (value and remote-write timestamp) to `out`.
    fn remote(&mut self, s: &SampleSeries, out: &mut Vec<Metric>) {
        for (t_us, v) in s.samples() {
            out.push(Metric {
                name: s.name.clone(),
                help: s.help.clone(),
                r#type: s.r#type,
                labels: s.labels.clone(),
                value: v,
                timestamp_ms: self.remote_ms(t_us),
                ..Metric::default()
            });
        }
    }

    /// The remote-write timestamp of a sample at `t_us`: its millisecond, or 1 ms after
    /// the previous one sent.
    fn remote_ms(&mut self, t_us: i64) -> i64 {
        let ms = t_us.div_euclid(1000).max(self.last_ms.saturating_add(1));
        self.last_ms = ms;
        ms
    }
}

/// The windows of every agent's series. See the module docs.
#[derive(Debug, Default)]
pub struct FastSeries {
    agents: HashMap<String, HashMap<String, Window>>,
}

/// What one sample series gives the outputs.
#[derive(Debug, Default)]
pub struct Observed {
    /// The latest value, for the store.
    pub latest: Metric,
    /// The rate series, for the store (counters with two samples in the window); when the
    /// series ended, the rate series' stale marker.
    pub rate: Option<Metric>,
    /// The series ended (its last sample is the stale marker): its window is forgotten.
    pub ended: bool,
}

/// The identity of a series within its agent: name and labels.
fn key(s: &SampleSeries) -> String {
    let mut labels: Vec<&Label> = s.labels.iter().collect();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    let mut k = s.name.clone();
    for l in labels {
        k.push('\u{0}');
        k.push_str(&l.name);
        k.push('\u{0}');
        k.push_str(&l.value);
    }
    k
}

/// The rate series' name for counter `name`.
pub fn rate_name(name: &str) -> String {
    format!(
        "{}{RATE_SUFFIX}",
        name.strip_suffix("_total").unwrap_or(name)
    )
}

impl FastSeries {
    /// Takes `s` (a validated series of `agent`): updates its window and, when `remote` is
    /// given, appends one [`Metric`] per sample (value and timestamp) to it.
    pub fn observe(
        &mut self,
        agent: &str,
        s: &SampleSeries,
        remote: Option<&mut Vec<Metric>>,
    ) -> Observed {
        // Untyped series (ethtool statistics) are counters in practice: they get a rate.
        let counter = s.r#type != MetricType::Gauge as i32;
        let series = match self.agents.get_mut(agent) {
            Some(m) => m,
            None => self.agents.entry(agent.to_owned()).or_default(),
        };
        let k = key(s);
        let rate_of = |value: f64| Metric {
            name: rate_name(&s.name),
            help: format!(
                "Per-second rate of {} over the last second of its fast_counters samples.",
                s.name
            ),
            r#type: MetricType::Gauge as i32,
            labels: s.labels.clone(),
            value,
            ..Metric::default()
        };
        if s.values
            .last()
            .is_some_and(|v| v.to_bits() == STALE_NAN_BITS)
        {
            let mut window = series.remove(&k).unwrap_or_default();
            if let Some(out) = remote {
                window.remote(s, out);
            }
            return Observed {
                latest: s.latest(),
                rate: counter.then(|| rate_of(f64::from_bits(STALE_NAN_BITS))),
                ended: true,
            };
        }
        let full = series.len() >= MAX_SERIES_PER_AGENT && !series.contains_key(&k);
        let mut spare = Window::default();
        let window = if full {
            &mut spare
        } else {
            series.entry(k).or_default()
        };
        for (t_us, v) in s.samples() {
            window.add(t_us, v, counter);
        }
        if let Some(out) = remote {
            window.remote(s, out);
        }
        let rate = (counter && !full)
            .then(|| window.rate())
            .flatten()
            .map(rate_of);
        Observed {
            latest: s.latest(),
            rate,
            ended: false,
        }
    }

    /// `agent` left: its windows go.
    pub fn forget(&mut self, agent: &str) {
        self.agents.remove(agent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(start_us: i64, step_us: u64, values: &[f64]) -> SampleSeries {
        SampleSeries {
            name: "node_infiniband_out_of_buffer_total".into(),
            help: "h".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![Label {
                name: "device".into(),
                value: "mlx5_0".into(),
            }],
            start_us,
            offsets_us: (0..values.len() as u64).map(|i| i * step_us).collect(),
            values: values.to_vec(),
        }
    }

    #[test]
    fn the_rate_covers_the_last_second_across_records() {
        let mut f = FastSeries::default();
        // 10 ms samples rising by 5 per sample: 500 per second.
        let t0 = 1_700_000_000_000_000;
        let first: Vec<f64> = (0..100).map(|i| f64::from(i) * 5.0).collect();
        let o = f.observe("a", &series(t0, 10_000, &first), None);
        assert_eq!(o.latest.value, 495.0);
        let rate = o.rate.unwrap();
        assert_eq!(rate.name, "node_infiniband_out_of_buffer_per_second");
        assert!((rate.value - 500.0).abs() < 1e-9, "{}", rate.value);
        // The next record: the window slides, still 500/s; then a burst of 1000 in 10 ms.
        let next: Vec<f64> = (100..120).map(|i| f64::from(i) * 5.0).collect();
        let o = f.observe("a", &series(t0 + 1_000_000, 10_000, &next), None);
        assert!((o.rate.unwrap().value - 500.0).abs() < 1e-9);
        let o = f.observe(
            "a",
            &series(t0 + 1_200_000, 10_000, &[600.0 + 1000.0]),
            None,
        );
        let r = o.rate.unwrap().value;
        assert!(r > 1400.0 && r < 1600.0, "{r}");
    }

    #[test]
    fn a_reset_restarts_the_window() {
        let mut f = FastSeries::default();
        let t0 = 1_000_000;
        f.observe("a", &series(t0, 10_000, &[100.0, 200.0, 300.0]), None);
        let o = f.observe("a", &series(t0 + 30_000, 10_000, &[5.0]), None);
        assert!(o.rate.is_none(), "one sample since the reset");
        let o = f.observe("a", &series(t0 + 40_000, 10_000, &[15.0]), None);
        assert!((o.rate.unwrap().value - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn every_sample_goes_to_remote_write_with_increasing_milliseconds() {
        let mut f = FastSeries::default();
        let mut out = Vec::new();
        // Three samples within one millisecond, then one 10 ms later.
        let mut s = series(2_000_000_000, 300, &[1.0, 2.0, 3.0]);
        s.offsets_us.push(10_000);
        s.values.push(4.0);
        f.observe("a", &s, Some(&mut out));
        let ts: Vec<i64> = out.iter().map(|m| m.timestamp_ms).collect();
        assert_eq!(ts, [2_000_000, 2_000_001, 2_000_002, 2_000_010]);
        assert_eq!(
            out.iter().map(|m| m.value).collect::<Vec<_>>(),
            [1.0, 2.0, 3.0, 4.0]
        );
        // Gauges get no rate.
        let mut g = series(3_000_000_000, 10_000, &[1.0, 5.0]);
        g.r#type = MetricType::Gauge as i32;
        assert!(f.observe("a", &g, None).rate.is_none());
        // Untyped (ethtool statistics): a counter in practice, with a rate.
        let mut u = series(3_000_000_000, 10_000, &[1.0, 5.0]);
        u.name = "node_ethtool_received_prio3_pause".into();
        u.r#type = MetricType::Untyped as i32;
        let r = f.observe("a", &u, None).rate.unwrap();
        assert_eq!(r.name, "node_ethtool_received_prio3_pause_per_second");
        assert!((r.value - 400.0).abs() < 1e-9, "{}", r.value);
    }

    #[test]
    fn a_stale_marker_ends_the_series_and_its_window_and_rate() {
        let mut f = FastSeries::default();
        let mut out = Vec::new();
        f.observe("a", &series(1_000_000, 10_000, &[1.0, 2.0]), Some(&mut out));
        assert_eq!(f.agents["a"].len(), 1);
        let stale = f64::from_bits(STALE_NAN_BITS);
        let o = f.observe("a", &series(1_020_000, 10_000, &[stale]), Some(&mut out));
        assert!(o.ended);
        assert_eq!(
            o.latest.value.to_bits(),
            STALE_NAN_BITS,
            "the store removes it"
        );
        let rate = o.rate.unwrap();
        assert_eq!(rate.name, "node_infiniband_out_of_buffer_per_second");
        assert_eq!(rate.value.to_bits(), STALE_NAN_BITS);
        assert!(f.agents["a"].is_empty(), "its window is forgotten");
        let last = out.last().unwrap();
        assert_eq!(
            (last.value.to_bits(), last.timestamp_ms),
            (STALE_NAN_BITS, 1_020)
        );
        // A gauge has no rate series to end.
        let mut g = series(1_030_000, 10_000, &[stale]);
        g.r#type = MetricType::Gauge as i32;
        assert!(f.observe("a", &g, None).rate.is_none());
    }

    #[test]
    fn agents_and_series_are_bounded() {
        let mut f = FastSeries::default();
        for i in 0..MAX_SERIES_PER_AGENT + 3 {
            let mut s = series(1_000_000, 10_000, &[1.0, 2.0]);
            s.name = format!("c{i}_total");
            let o = f.observe("a", &s, None);
            assert_eq!(o.rate.is_some(), i < MAX_SERIES_PER_AGENT, "{i}");
        }
        assert_eq!(f.agents["a"].len(), MAX_SERIES_PER_AGENT);
        f.forget("a");
        assert!(f.agents.is_empty());
    }
}
