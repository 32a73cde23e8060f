//! The remote-write 1.0 wire messages (`prompb`: `WriteRequest`, `TimeSeries`, `Label`,
//! `Sample`, field numbers as in Prometheus' `prompb/remote.proto` and `types.proto`), and a
//! request encoder that writes each series' labels from bytes encoded once per series.
//!
//! [`encode_request`] writes the same bytes as prost's `WriteRequest::encode` of the
//! equivalent message (a test checks), without building a `Vec<Label>` per sample. The body
//! is then compressed with snappy's **block** format (`snap::raw`), never the framed one
//! (remote-write spec, "Protocol").

use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;

/// `prometheus.WriteRequest` (field 1: timeseries; 3: metadata, not sent).
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// The series with their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries` (1: labels, 2: samples).
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// Labels, sorted by name, `__name__` among them.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples, oldest first.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label` (1: name, 2: value).
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Label {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample` (1: value, 2: timestamp in ms since the Unix epoch).
#[derive(Clone, Copy, PartialEq, Message)]
pub struct Sample {
    /// The value (the stale marker is [`stale_nan`]).
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// The stale marker's bit pattern (remote-write spec, "Stale markers"; Prometheus
/// `value.StaleNaN`).
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// The stale marker value.
pub fn stale_nan() -> f64 {
    f64::from_bits(STALE_NAN_BITS)
}

/// The `labels` fields (tag 1) of a `TimeSeries`, encoded once for a series: append them to
/// a `TimeSeries` body as they are.
pub fn encode_labels<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in labels {
        let label = Label {
            name: name.to_owned(),
            value: value.to_owned(),
        };
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(label.encoded_len() as u64, &mut out);
        label.encode_raw(&mut out);
    }
    out
}

/// Appends one `TimeSeries` (pre-encoded `labels`, `samples` in order) as field 1 of a
/// `WriteRequest` to `out`.
pub fn encode_series(labels: &[u8], samples: &[Sample], out: &mut Vec<u8>) {
    let sample_len = |s: &Sample| s.encoded_len();
    let body: usize = labels.len()
        + samples
            .iter()
            .map(|s| {
                let l = sample_len(s);
                1 + encoded_len_varint(l as u64) + l
            })
            .sum::<usize>();
    encode_key(1, WireType::LengthDelimited, out);
    encode_varint(body as u64, out);
    out.extend_from_slice(labels);
    for s in samples {
        encode_key(2, WireType::LengthDelimited, out);
        encode_varint(sample_len(s) as u64, out);
        s.encode_raw(out);
    }
}

/// A whole `WriteRequest` body from `(labels, samples)` pairs, then snappy block-compressed.
///
/// # Errors
/// snappy's error for an input above its 4 GiB block limit (a request is far smaller).
pub fn encode_request<'a>(
    series: impl IntoIterator<Item = (&'a [u8], &'a [Sample])>,
    scratch: &mut Vec<u8>,
) -> Result<Vec<u8>, snap::Error> {
    scratch.clear();
    for (labels, samples) in series {
        encode_series(labels, samples, scratch);
    }
    snap::raw::Encoder::new().compress_vec(scratch)
}

/// Decodes a snappy block-compressed `WriteRequest` (for tests and the receivers tests run).
///
/// # Errors
/// A description of the snappy or protobuf error.
pub fn decode_request(body: &[u8]) -> Result<WriteRequest, String> {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .map_err(|e| format!("snappy: {e}"))?;
    WriteRequest::decode(raw.as_slice()).map_err(|e| format!("protobuf: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoder_writes_the_bytes_prost_writes() {
        let labels = [("__name__", "up"), ("agent", "a-1"), ("instance", "h")];
        let samples = [
            Sample {
                value: 1.0,
                timestamp: 1_700_000_000_123,
            },
            Sample {
                value: stale_nan(),
                timestamp: 1_700_000_000_124,
            },
            Sample {
                value: 0.0,
                timestamp: 0,
            },
        ];
        let other_labels = [("__name__", "x"), ("a", "")];
        let enc = encode_labels(labels);
        let other = encode_labels(other_labels);
        let mut scratch = Vec::new();
        let body = encode_request(
            [
                (enc.as_slice(), &samples[..]),
                (other.as_slice(), &samples[..1]),
            ],
            &mut scratch,
        )
        .unwrap();
        let want = WriteRequest {
            timeseries: vec![
                TimeSeries {
                    labels: labels
                        .iter()
                        .map(|(n, v)| Label {
                            name: (*n).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    samples: samples.to_vec(),
                },
                TimeSeries {
                    labels: other_labels
                        .iter()
                        .map(|(n, v)| Label {
                            name: (*n).into(),
                            value: (*v).into(),
                        })
                        .collect(),
                    samples: samples[..1].to_vec(),
                },
            ],
        };
        assert_eq!(scratch, want.encode_to_vec());
        let back = decode_request(&body).unwrap();
        assert_eq!(back.timeseries.len(), 2);
        assert_eq!(back.timeseries[0].labels, want.timeseries[0].labels);
        assert_eq!(
            back.timeseries[0].samples[1].value.to_bits(),
            STALE_NAN_BITS
        );
        // Block format, not framed: the framed format starts with its stream identifier.
        assert_ne!(body.first(), Some(&0xff));
        assert_eq!(
            snap::raw::decompress_len(&body).unwrap(),
            want.encoded_len()
        );
    }
}
