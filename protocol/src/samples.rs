//! Sample series: many samples of one counter or gauge in one record, for the agent's
//! high-frequency `fast_counters` source (DESIGN.md §7). A frame of kind `samples` (4)
//! carries a [`SampleBatch`] (`proto/uctel.proto`); the types below are its `prost` mirror.
//!
//! Shape of one [`SampleSeries`]: the series' identity as a [`Metric`] has it (name, help,
//! type, labels) plus `n ≥ 1` samples: `start_us` (µs since the Unix epoch of the first
//! sample), `offsets_us[i]` (µs from `start_us` to sample `i`, non-decreasing, so
//! `offsets_us[0]` is usually 0) and `values[i]`. Packed on the wire, a sample costs its
//! 8-byte value plus a 2–3 byte offset at a 10 ms interval, so a 4 KiB frame holds about
//! 350 samples.
//!
//! **Accounting unit.** A sample series counts as one record *per sample*
//! ([`SampleSeries::weight`]): the frame header's cumulative `record_count`, the agent's
//! records sent and dropped and the collector's records received and lost all count
//! samples on a samples stream, so the exact per-stream sum rule of the other streams
//! (sent = received + lost, DESIGN.md §5) holds for samples.

use crate::limits::{Limit, Limits};
pub use crate::payload::SamplesError;
use crate::payload::{
    check_metric, Bucket, Label, Metric, MetricParts, MetricType, PayloadError, RecordError,
};
use prost::Message as _;

pub use crate::limits::MAX_SAMPLES_PER_SERIES;

/// Samples of one counter or gauge series. See the module docs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleSeries {
    /// Metric name (Prometheus rules).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The `# HELP` text; may be empty.
    #[prost(string, tag = "2")]
    pub help: String,
    /// A [`MetricType`] as its `i32`: counter, gauge or untyped.
    #[prost(enumeration = "MetricType", tag = "3")]
    pub r#type: i32,
    /// The series' labels, without the `agent`/`instance` labels the collector adds.
    #[prost(message, repeated, tag = "4")]
    pub labels: Vec<Label>,
    /// Time of the first sample, µs since the Unix epoch (> 0).
    #[prost(int64, tag = "5")]
    pub start_us: i64,
    /// Per sample: µs after `start_us`, non-decreasing.
    #[prost(uint64, repeated, tag = "6")]
    pub offsets_us: Vec<u64>,
    /// Per sample: the value (a counter's cumulative count, a gauge's level).
    #[prost(double, repeated, tag = "7")]
    pub values: Vec<f64>,
}

/// The payload of a `kind = samples` frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleBatch {
    /// The series, one record each (one accounting unit per sample).
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<SampleSeries>,
}

impl SampleSeries {
    /// Samples carried: the records this series counts as in every accounting (module
    /// docs), saturated at `u32::MAX`.
    pub fn weight(&self) -> u32 {
        u32::try_from(self.values.len()).unwrap_or(u32::MAX)
    }

    /// Sample `i`'s time in µs since the Unix epoch, saturating.
    pub fn time_us(&self, i: usize) -> Option<i64> {
        let offset = i64::try_from(*self.offsets_us.get(i)?).unwrap_or(i64::MAX);
        Some(self.start_us.saturating_add(offset))
    }

    /// `(time µs since the Unix epoch, value)` of every sample, in order.
    pub fn samples(&self) -> impl Iterator<Item = (i64, f64)> + '_ {
        (0..self.values.len().min(self.offsets_us.len()))
            .map(|i| (self.time_us(i).unwrap_or(self.start_us), self.values[i]))
    }

    /// The last sample as a plain [`Metric`] (`value` and `timestamp_ms` of the last
    /// sample): what a consumer that keeps only the latest value stores.
    pub fn latest(&self) -> Metric {
        let last = self.values.len().checked_sub(1);
        Metric {
            name: self.name.clone(),
            help: self.help.clone(),
            r#type: self.r#type,
            labels: self.labels.clone(),
            value: last.map_or(0.0, |i| self.values[i]),
            timestamp_ms: last
                .and_then(|i| self.time_us(i))
                .map_or(0, |us| us.div_euclid(1000)),
            ..Metric::default()
        }
    }
}

impl MetricParts for SampleSeries {
    type Label = Label;
    fn name(&self) -> &str {
        &self.name
    }
    fn help(&self) -> &str {
        &self.help
    }
    fn kind(&self) -> i32 {
        self.r#type
    }
    fn labels(&self) -> &[Label] {
        &self.labels
    }
    fn buckets(&self) -> &[Bucket] {
        &[]
    }
    fn value(&self) -> f64 {
        self.values.last().copied().unwrap_or(0.0)
    }
    fn count(&self) -> u64 {
        0
    }
    fn sum(&self) -> f64 {
        0.0
    }
}

/// Check one sample series: the metric rules for its identity (name, help, labels) and
/// type, then its samples.
///
/// # Errors
/// The first [`RecordError`] found; sample problems as [`RecordError::Samples`].
pub fn validate_sample_series(series: &SampleSeries, limits: &Limits) -> Result<(), RecordError> {
    check_metric(series, limits)?;
    let samples = |e| Err(RecordError::Samples(e));
    let kinds = [MetricType::Counter, MetricType::Gauge, MetricType::Untyped];
    if !kinds.iter().any(|k| series.r#type == *k as i32) {
        return samples(SamplesError::BadType {
            value: series.r#type,
        });
    }
    let n = series.values.len();
    if n == 0 || n > MAX_SAMPLES_PER_SERIES {
        return samples(SamplesError::Count { found: n });
    }
    if series.offsets_us.len() != n {
        return samples(SamplesError::LengthMismatch {
            offsets: series.offsets_us.len(),
            values: n,
        });
    }
    if series.start_us <= 0 {
        return samples(SamplesError::BadStart {
            start_us: series.start_us,
        });
    }
    if let Some(index) = (1..n).find(|&i| series.offsets_us[i] < series.offsets_us[i - 1]) {
        return samples(SamplesError::OffsetDecreasing { index });
    }
    Ok(())
}

/// Encode a [`SampleBatch`] as a frame payload.
pub fn encode_sample_batch(batch: &SampleBatch) -> Vec<u8> {
    batch.encode_to_vec()
}

/// Decode and validate the payload of a samples frame: bounded by `max_frame_bytes` before
/// decoding, at most `max_records_per_frame` series, every series valid.
///
/// # Errors
/// [`PayloadError::Batch`] (payload too large, too many series), [`PayloadError::Protobuf`]
/// (malformed, invalid UTF-8), [`PayloadError::Record`].
pub fn decode_sample_batch(payload: &[u8], limits: &Limits) -> Result<SampleBatch, PayloadError> {
    limits
        .check(
            Limit::FrameBytes,
            payload.len().saturating_add(crate::limits::HEADER_LEN),
        )
        .map_err(PayloadError::Batch)?;
    let batch = SampleBatch::decode(payload).map_err(|source| PayloadError::Protobuf {
        message: "SampleBatch",
        source,
    })?;
    limits
        .check(Limit::RecordsPerFrame, batch.series.len())
        .map_err(PayloadError::Batch)?;
    for (index, series) in batch.series.iter().enumerate() {
        validate_sample_series(series, limits)
            .map_err(|source| PayloadError::Record { index, source })?;
    }
    Ok(batch)
}

/// Samples in a decoded batch: the records it counts as.
pub fn batch_weight(batch: &SampleBatch) -> u64 {
    batch.series.iter().map(|s| u64::from(s.weight())).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(n: usize) -> SampleSeries {
        SampleSeries {
            name: "node_infiniband_port_data_received_bytes_total".into(),
            help: "h".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![Label {
                name: "device".into(),
                value: "mlx5_0".into(),
            }],
            start_us: 1_700_000_000_000_000,
            offsets_us: (0..n as u64).map(|i| i * 10_000).collect(),
            values: (0..n).map(|i| (i * 4096) as f64).collect(),
        }
    }

    #[test]
    fn a_batch_round_trips_and_weighs_its_samples() {
        let batch = SampleBatch {
            series: vec![series(20), series(3)],
        };
        let bytes = encode_sample_batch(&batch);
        let back = decode_sample_batch(&bytes, &Limits::default()).unwrap();
        assert_eq!(back, batch);
        assert_eq!(batch_weight(&back), 23);
        // Packed: about 11 bytes per sample at a 10 ms interval, plus the identity.
        let one = encode_sample_batch(&SampleBatch {
            series: vec![series(300)],
        });
        assert!(one.len() < 300 * 12 + 120, "{} bytes", one.len());
    }

    #[test]
    fn latest_is_the_last_sample() {
        let s = series(5);
        let m = s.latest();
        assert_eq!(m.value, 4.0 * 4096.0);
        assert_eq!(m.timestamp_ms, 1_700_000_000_000 + 40);
        assert_eq!(m.labels, s.labels);
        let all: Vec<_> = s.samples().collect();
        assert_eq!(all.len(), 5);
        assert_eq!(all[1], (1_700_000_000_010_000, 4096.0));
    }

    #[test]
    fn bad_series_are_rejected_with_their_reason() {
        let limits = Limits::default();
        let check = |s: SampleSeries| validate_sample_series(&s, &limits);
        assert!(check(series(1)).is_ok());
        let mut s = series(2);
        s.r#type = MetricType::Histogram as i32;
        assert_eq!(
            check(s),
            Err(RecordError::Samples(SamplesError::BadType { value: 3 }))
        );
        assert_eq!(
            check(series(0)),
            Err(RecordError::Samples(SamplesError::Count { found: 0 }))
        );
        let mut s = series(3);
        s.offsets_us.pop();
        assert_eq!(
            check(s),
            Err(RecordError::Samples(SamplesError::LengthMismatch {
                offsets: 2,
                values: 3
            }))
        );
        let mut s = series(3);
        s.start_us = 0;
        assert!(matches!(
            check(s),
            Err(RecordError::Samples(SamplesError::BadStart { .. }))
        ));
        let mut s = series(3);
        s.offsets_us[2] = 1;
        assert_eq!(
            check(s),
            Err(RecordError::Samples(SamplesError::OffsetDecreasing {
                index: 2
            }))
        );
        let mut s = series(3);
        s.name = "bad name".into();
        assert!(matches!(check(s), Err(RecordError::BadMetricName { .. })));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &[0xffu8, 0xff][..],
            &[0x0a, 0x05, 0x0a],
            &[0x0a, 0x02, 0x30, 0x00],
        ] {
            let _ = decode_sample_batch(bytes, &Limits::default());
        }
        assert!(decode_sample_batch(&[0x0a, 0xff], &Limits::default()).is_err());
        // An empty series fails validation.
        assert!(decode_sample_batch(&[0x0a, 0x00], &Limits::default()).is_err());
    }
}
