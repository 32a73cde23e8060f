//! Property tests for the frame header, payload codec and framer (1,000 cases each).

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use uctel_protocol::frame::{
    build_frame, decode_frame, peek_conn_seq, stamp_connection, verify_frame, DecodeError,
    FrameError, FrameFlags, FrameHeader, FrameKind, Payload, HEADER_LEN,
};
use uctel_protocol::framer::{Framer, Rejection};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{
    decode_log_batch, decode_metric_batch, encode_log_batch, encode_metric_batch, Bucket, Field,
    Label, LogBatch, LogRecord, Metric, MetricBatch, MetricType,
};

fn not_nan() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN never compares equal", |v| !v.is_nan())
}

fn arb_labels() -> impl Strategy<Value = Vec<Label>> {
    btree_map(
        "[a-zA-Z][a-zA-Z0-9_]{0,15}|_[a-zA-Z0-9][a-zA-Z0-9_]{0,10}",
        ".{0,24}",
        0..6,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(name, value)| Label { name, value })
            .collect()
    })
}

fn arb_buckets() -> impl Strategy<Value = (Vec<Bucket>, u64)> {
    (vec((1e-6f64..1e3, 0u64..1000), 0..8), 0u64..1000).prop_map(|(steps, extra)| {
        let mut bound = 0.0;
        let mut count = 0u64;
        let buckets = steps
            .into_iter()
            .map(|(step, add)| {
                bound += step;
                count += add;
                Bucket {
                    upper_bound: bound,
                    cumulative_count: count,
                }
            })
            .collect();
        (buckets, count + extra)
    })
}

prop_compose! {
    fn arb_metric()(
        name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,40}",
        help in ".{0,40}",
        kind in prop_oneof![
            Just(MetricType::Counter),
            Just(MetricType::Gauge),
            Just(MetricType::Histogram)
        ],
        labels in arb_labels(),
        value in not_nan(),
        timestamp_ms in any::<i64>(),
        (buckets, count) in arb_buckets(),
        sum in not_nan(),
    ) -> Metric {
        let histogram = kind == MetricType::Histogram;
        Metric {
            name,
            help,
            r#type: kind as i32,
            labels,
            value: if histogram { 0.0 } else { value },
            timestamp_ms,
            buckets: if histogram { buckets } else { Vec::new() },
            count: if histogram { count } else { 0 },
            sum: if histogram { sum } else { 0.0 },
        }
    }
}

prop_compose! {
    fn arb_log()(
        timestamp_ns in any::<u64>(),
        severity in 0i32..=6,
        source in ".{0,30}",
        message in ".{0,200}",
        fields in vec((".{0,12}", ".{0,24}"), 0..5),
        file_id in any::<u64>(),
        end_offset in any::<u64>(),
    ) -> LogRecord {
        LogRecord {
            timestamp_ns,
            severity,
            source,
            message,
            fields: fields.into_iter().map(|(key, value)| Field { key, value }).collect(),
            file_id,
            end_offset,
        }
    }
}

prop_compose! {
    fn arb_header(kind: FrameKind)(
        last in any::<bool>(),
        stream_id in any::<u32>(),
        epoch in any::<u64>(),
        conn_seq in any::<u64>(),
        stream_seq in any::<u64>(),
        timestamp_ns in any::<u64>(),
        record_count in any::<u64>(),
    ) -> FrameHeader {
        FrameHeader {
            kind,
            flags: if last { FrameFlags::LAST_OF_EPOCH } else { FrameFlags::EMPTY },
            stream_id,
            payload_len: 0,
            epoch,
            conn_seq,
            stream_seq,
            timestamp_ns,
            record_count,
        }
    }
}

#[derive(Debug, Clone)]
enum AnyPayload {
    Metrics(MetricBatch),
    Logs(LogBatch),
    Heartbeat,
}

fn arb_frame() -> impl Strategy<Value = (FrameHeader, AnyPayload)> {
    prop_oneof![
        (
            arb_header(FrameKind::Metrics),
            vec(arb_metric(), 0..12)
                .prop_map(|metrics| AnyPayload::Metrics(MetricBatch { metrics }))
        ),
        (
            arb_header(FrameKind::Logs),
            vec(arb_log(), 0..8).prop_map(|records| AnyPayload::Logs(LogBatch { records }))
        ),
        (
            arb_header(FrameKind::Heartbeat),
            Just(AnyPayload::Heartbeat)
        ),
    ]
}

/// Generous frame bound so any generated batch fits; the framer test covers tight bounds.
fn roomy() -> Limits {
    Limits {
        max_frame_bytes: 1 << 20,
        ..Limits::default()
    }
}

/// A valid frame to mutate, so the fuzz-like tests also reach the CRC and payload checks.
fn arb_valid_frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    arb_frame().prop_map(|(header, payload)| {
        let body = match &payload {
            AnyPayload::Metrics(b) => encode_metric_batch(b),
            AnyPayload::Logs(b) => encode_log_batch(b),
            AnyPayload::Heartbeat => Vec::new(),
        };
        build_frame(&header, &body).unwrap_or_default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn frame_round_trip((header, payload) in arb_frame(), trailing in vec(any::<u8>(), 0..32)) {
        let body = match &payload {
            AnyPayload::Metrics(b) => encode_metric_batch(b),
            AnyPayload::Logs(b) => encode_log_batch(b),
            AnyPayload::Heartbeat => Vec::new(),
        };
        let mut bytes = build_frame(&header, &body).unwrap();
        prop_assert_eq!(bytes.len(), HEADER_LEN + body.len());
        prop_assert_eq!(peek_conn_seq(&bytes), Some(header.conn_seq));
        // A ring slot holds the frame followed by stale bytes.
        bytes.extend_from_slice(&trailing);
        let decoded = decode_frame(&bytes, &roomy()).unwrap();
        let expect_header = FrameHeader { payload_len: body.len() as u32, ..header };
        prop_assert_eq!(decoded.header, expect_header);
        match (decoded.payload, payload) {
            (Payload::Metrics(got), AnyPayload::Metrics(want)) => prop_assert_eq!(got, want),
            (Payload::Logs(got), AnyPayload::Logs(want)) => prop_assert_eq!(got, want),
            (Payload::Heartbeat, AnyPayload::Heartbeat) => {}
            (got, want) => prop_assert!(false, "kind changed: {:?} vs {:?}", got, want),
        }
    }

    #[test]
    fn any_single_bit_flip_is_detected(bytes in arb_valid_frame_bytes(), pos in any::<usize>(), bit in 0u8..8) {
        let mut bad = bytes.clone();
        let i = pos % bad.len();
        bad[i] ^= 1 << bit;
        // Either a header check or the CRC rejects it; a bit flip in payload_len may also
        // make the frame truncated. Never accepted, never a panic.
        prop_assert!(verify_frame(&bad).is_err());
    }

    #[test]
    fn decode_of_arbitrary_bytes_never_panics(bytes in vec(any::<u8>(), 0..2048)) {
        let limits = Limits::default();
        let _ = decode_frame(&bytes, &limits);
        let _ = decode_metric_batch(&bytes, &limits);
        let _ = decode_log_batch(&bytes, &limits);
        let _ = peek_conn_seq(&bytes);
    }

    #[test]
    fn decode_of_mutated_frames_never_panics(
        bytes in arb_valid_frame_bytes(),
        edits in vec((any::<usize>(), any::<u8>()), 1..8),
        reseal in any::<bool>(),
    ) {
        let mut bad = bytes;
        for (pos, value) in edits {
            let i = pos % bad.len();
            bad[i] = value;
        }
        if reseal {
            // Refill the CRC so the payload decoder sees the corrupted payload.
            let _ = stamp_connection(&mut bad, 1, 2);
        }
        match decode_frame(&bad, &roomy()) {
            Ok(d) => {
                // Whatever decodes must re-encode to a frame that decodes the same.
                let body = match &d.payload {
                    Payload::Metrics(b) => encode_metric_batch(b),
                    Payload::Logs(b) => encode_log_batch(b),
                    Payload::Heartbeat => Vec::new(),
                    Payload::Samples(b) => uctel_protocol::samples::encode_sample_batch(b),
                };
                let again = decode_frame(&build_frame(&d.header, &body).unwrap(), &roomy()).unwrap();
                prop_assert_eq!(again.payload, d.payload);
            }
            Err(DecodeError::Frame(_) | DecodeError::Payload { .. }) => {}
        }
    }

    #[test]
    fn framer_respects_limits_and_accounts_for_every_record(
        records in vec(
            prop_oneof![
                8 => arb_metric(),
                // Some records too large for small frames.
                1 => arb_metric().prop_map(|mut m| { m.help = "h".repeat(900); m }),
                // Some invalid records.
                1 => arb_metric().prop_map(|mut m| { m.name = "bad name".into(); m }),
            ],
            0..60,
        ),
        max_frame_bytes in 100usize..4096,
        max_records_per_frame in 1usize..40,
        first_stream_seq in any::<u64>(),
        now in any::<u64>(),
    ) {
        let limits = Limits { max_frame_bytes, max_records_per_frame, ..Limits::default() };
        let mut framer = Framer::<Metric>::new(5, first_stream_seq, limits.clone()).unwrap();
        let packed = framer.pack(&records, now);
        let rejected: Vec<usize> = packed.rejected.iter().map(|(i, _)| *i).collect();
        for (i, why) in &packed.rejected {
            match why {
                Rejection::Oversize { encoded_len, max_payload_bytes } => {
                    prop_assert!(encoded_len > max_payload_bytes);
                    prop_assert_eq!(*max_payload_bytes, max_frame_bytes - HEADER_LEN);
                }
                Rejection::Invalid(_) => prop_assert_eq!(&records[*i].name, "bad name"),
            }
        }
        let mut out = Vec::new();
        let mut expect_seq = first_stream_seq;
        for (conn_seq, frame) in packed.frames.into_iter().enumerate() {
            prop_assert!(frame.len() <= max_frame_bytes);
            prop_assert!(frame.records() as usize <= max_records_per_frame);
            prop_assert!(frame.records() > 0);
            prop_assert_eq!(frame.stream_seq(), expect_seq);
            expect_seq = expect_seq.wrapping_add(1);
            let (records_in_frame, cumulative) = (frame.records(), frame.record_count());
            let bytes = frame.into_stamped(3, conn_seq as u64);
            let d = decode_frame(&bytes, &limits).unwrap();
            prop_assert_eq!(d.header.record_count, cumulative);
            prop_assert_eq!(d.header.timestamp_ns, now);
            prop_assert_eq!(d.payload.record_count(), records_in_frame as usize);
            let Payload::Metrics(batch) = d.payload else {
                return Err(TestCaseError::fail("not a metrics frame"));
            };
            out.extend(batch.metrics);
            prop_assert_eq!(cumulative, out.len() as u64);
        }
        let expect: Vec<Metric> = records
            .iter()
            .enumerate()
            .filter(|(i, _)| !rejected.contains(i))
            .map(|(_, m)| m.clone())
            .collect();
        prop_assert_eq!(&out, &expect);
        let s = framer.stats();
        prop_assert_eq!(s.records_in, records.len() as u64);
        prop_assert_eq!(s.records_in, s.records_framed + s.records_open + s.oversize + s.invalid);
        prop_assert_eq!(s.records_open, 0);
        prop_assert_eq!(s.oversize + s.invalid, rejected.len() as u64);
    }

    #[test]
    fn log_framer_round_trip(
        records in vec(arb_log(), 0..40),
        max_frame_bytes in 300usize..4096,
    ) {
        let limits = Limits { max_frame_bytes, ..Limits::default() };
        let mut framer = Framer::<LogRecord>::new(9, 0, limits.clone()).unwrap();
        let packed = framer.pack(&records, 1);
        let mut out = Vec::new();
        for frame in packed.frames {
            prop_assert!(frame.len() <= max_frame_bytes);
            let d = decode_frame(&frame.into_stamped(1, 1), &limits).unwrap();
            let Payload::Logs(batch) = d.payload else {
                return Err(TestCaseError::fail("not a logs frame"));
            };
            out.extend(batch.records);
        }
        let expect: Vec<LogRecord> = records
            .iter()
            .enumerate()
            .filter(|(i, _)| !packed.rejected.iter().any(|(j, _)| j == i))
            .map(|(_, r)| r.clone())
            .collect();
        prop_assert_eq!(out, expect);
    }
}

#[test]
fn truncated_frame_reports_need_and_have() {
    let bytes = build_frame(&FrameHeader::new(FrameKind::Logs, 1), &[0; 10]).unwrap();
    assert_eq!(
        decode_frame(&bytes[..70], &Limits::default()).unwrap_err(),
        DecodeError::Frame(FrameError::Truncated { need: 74, have: 70 })
    );
}
