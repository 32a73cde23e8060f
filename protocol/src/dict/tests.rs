//! Tests of the series dictionary: round trips, the acknowledgment rule under loss,
//! duplication and reordering with series churn and epoch changes (the pair property), and
//! malformed bodies.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::*;
use crate::borrowed::MetricBatchView;
use crate::frame::{Frame, FrameKind};
use crate::framer::{BuiltFrame, PushOutcome};
use crate::payload::{Bucket, Label, Metric, MetricType};

fn metric(name: &str, labels: &[(&str, &str)], kind: MetricType, value: f64) -> Metric {
    Metric {
        name: name.into(),
        help: format!("help of {name}"),
        r#type: kind as i32,
        labels: labels
            .iter()
            .map(|(n, v)| Label {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect(),
        value,
        ..Metric::default()
    }
}

fn histogram(name: &str, counts: [u64; 3], count: u64, sum: f64) -> Metric {
    Metric {
        name: name.into(),
        r#type: MetricType::Histogram as i32,
        buckets: [0.1, 1.0, 10.0]
            .iter()
            .zip(counts)
            .map(|(b, c)| Bucket {
                upper_bound: *b,
                cumulative_count: c,
            })
            .collect(),
        count,
        sum,
        ..Metric::default()
    }
}

/// A node_exporter-like collection of `n` series at round `round`.
fn collection(n: usize, round: u64) -> Vec<Metric> {
    (0..n)
        .map(|i| {
            let cpu = i.to_string();
            match i % 4 {
                0 => metric(
                    "node_cpu_seconds_total",
                    &[("cpu", &cpu), ("mode", "user")],
                    MetricType::Counter,
                    1234.56 + round as f64 * 0.01 + i as f64,
                ),
                1 => metric(
                    "node_network_receive_bytes_total",
                    &[("device", &format!("eth{i}"))],
                    MetricType::Counter,
                    (10_000_000_000 + round * 1000 + i as u64) as f64,
                ),
                2 => metric(
                    "node_load1",
                    &[("n", &i.to_string())],
                    MetricType::Gauge,
                    0.37 * (round as f64 + 1.0) / 3.0,
                ),
                _ => metric(
                    "node_memory_MemFree_bytes",
                    &[("n", &i.to_string())],
                    MetricType::Gauge,
                    -((round + i as u64) as f64),
                ),
            }
        })
        .collect()
}

/// Pushes `metrics`, returning each closed frame with the metrics that went into it.
fn pack(f: &mut DictFramer, metrics: &[Metric], now_ns: u64) -> Vec<(BuiltFrame, Vec<Metric>)> {
    let mut out = Vec::new();
    let mut pending = Vec::new();
    for m in metrics {
        match f.push(m, now_ns) {
            PushOutcome::Appended => pending.push(m.clone()),
            PushOutcome::Closed(frame) => {
                out.push((frame, std::mem::take(&mut pending)));
                pending.push(m.clone());
            }
            PushOutcome::Rejected(r) => panic!("rejected: {r}"),
        }
    }
    if let Some(frame) = f.flush() {
        out.push((frame, pending));
    }
    out
}

fn sealed(frame: &BuiltFrame, epoch: u64) -> Vec<u8> {
    frame.clone().into_stamped(epoch, frame.stream_seq())
}

/// Decodes a sealed frame with `dict` into owned metrics.
fn decode(dict: &mut SeriesDict, bytes: &[u8]) -> Result<Vec<Metric>, PayloadError> {
    let frame = Frame::new_checked(bytes).expect("a frame");
    assert_eq!(frame.kind(), FrameKind::MetricsDict);
    let mut batch = MetricBatchView::new();
    dict.decode_into(
        frame.payload(),
        frame.timestamp_ns(),
        &Limits::default(),
        &mut batch,
    )?;
    Ok(batch.iter().map(|v| v.to_metric()).collect())
}

use crate::payload::PayloadError;

#[test]
fn frames_round_trip_and_shrink_once_acknowledged() {
    let limits = Limits {
        max_frame_bytes: 1024,
        ..Limits::default()
    };
    let mut f = DictFramer::new(1, 0, limits).unwrap();
    let mut dict = SeriesDict::new();
    let now = 1_700_000_000_000_000_000;
    let mut bytes_per_round = Vec::new();
    for round in 0..4 {
        let metrics = collection(450, round);
        let frames = pack(&mut f, &metrics, now + round * 10_000_000_000);
        let mut bytes = 0;
        for (frame, expected) in &frames {
            bytes += frame.len();
            assert!(frame.len() <= 1024);
            let got = decode(&mut dict, &sealed(frame, 7)).unwrap();
            assert_eq!(&got, expected, "round {round}");
            assert_eq!(f.decode_own(frame.bytes()).unwrap(), *expected);
        }
        bytes_per_round.push(bytes);
        if let Some(ack) = dict.take_ack() {
            f.on_ack(ack);
        }
        assert_eq!(dict.take_ack(), None, "an acknowledgment is taken once");
    }
    assert_eq!(dict.known_up_to(), 450);
    let steady = bytes_per_round[3] as f64 / 450.0;
    assert!(
        steady <= 16.0,
        "{steady} bytes per sample in the steady state"
    );
    assert!(
        bytes_per_round[0] > 4 * bytes_per_round[3],
        "{bytes_per_round:?}"
    );
}

#[test]
fn own_timestamps_histograms_and_odd_values_round_trip() {
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let now = 1_700_000_000_123_000_000;
    let mut ms = metric("a", &[], MetricType::Gauge, f64::NAN);
    ms.timestamp_ms = 1_700_000_000_000;
    let values = [
        -0.0,
        0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e300,
        -1.5,
        0.1,
        123.456,
        2f64.powi(60),
        -(2f64.powi(52)),
        f64::MIN_POSITIVE,
    ];
    let mut metrics = vec![ms];
    for (i, v) in values.iter().enumerate() {
        metrics.push(metric("g", &[("i", &i.to_string())], MetricType::Gauge, *v));
    }
    metrics.push(histogram("h", [1, 5, 9], 10, 4.5));
    let mut dict = SeriesDict::new();
    for round in 0..2 {
        for (frame, expected) in pack(&mut f, &metrics, now) {
            let got = decode(&mut dict, &sealed(&frame, 1)).unwrap();
            assert_eq!(got.len(), expected.len());
            for (g, e) in got.iter().zip(&expected) {
                assert_eq!(
                    g.value.to_bits(),
                    e.value.to_bits(),
                    "{} round {round}",
                    e.name
                );
                assert_eq!(g.timestamp_ms, e.timestamp_ms);
                assert_eq!((g.name.as_str(), &g.labels), (e.name.as_str(), &e.labels));
                assert_eq!((&g.buckets, g.count, g.sum), (&e.buckets, e.count, e.sum));
            }
        }
        f.on_ack(dict.take_ack().unwrap_or(0));
    }
}

#[test]
fn a_frame_read_alone_decodes_until_the_first_acknowledgment() {
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let metrics = collection(20, 0);
    let frames = pack(&mut f, &metrics, 1);
    let decoded = decode_frame_alone(&sealed(&frames[0].0, 3), &Limits::default());
    match decoded.unwrap().payload {
        crate::frame::Payload::Metrics(b) => assert_eq!(b.metrics, metrics),
        other => panic!("{other:?}"),
    }
    f.on_ack(20);
    let frames = pack(&mut f, &metrics, 2);
    let alone = decode_frame_alone(&sealed(&frames[0].0, 3), &Limits::default());
    assert!(matches!(
        alone,
        Err(crate::frame::DecodeError::Payload {
            source: PayloadError::Dictionary(DictError::UnknownSeries { id: 0 }),
            ..
        })
    ));
}

#[test]
fn a_redefinition_is_refused_and_changes_nothing() {
    let mut a = DictFramer::new(1, 0, Limits::default()).unwrap();
    let mut b = DictFramer::new(1, 0, Limits::default()).unwrap();
    let mut dict = SeriesDict::new();
    let first = pack(&mut a, &[metric("x", &[], MetricType::Gauge, 1.0)], 1);
    decode(&mut dict, &sealed(&first[0].0, 1)).unwrap();
    // Another series under the same id (another epoch's framer): refused whole.
    let other = pack(
        &mut b,
        &[
            metric("y", &[], MetricType::Gauge, 2.0),
            metric("x", &[], MetricType::Gauge, 3.0),
        ],
        1,
    );
    let err = decode(&mut dict, &sealed(&other[0].0, 1)).unwrap_err();
    assert_eq!(err, PayloadError::Dictionary(DictError::Conflict { id: 0 }));
    assert_eq!(
        dict.known_up_to(),
        1,
        "nothing of the refused frame was kept"
    );
}

#[test]
fn an_orphaned_definition_is_sent_again_so_the_prefix_moves_on() {
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let mut dict = SeriesDict::new();
    let s = 1_000_000_000;
    // Series 0 and 1; the frame defining them is lost; series 1 then vanishes.
    let _lost = pack(
        &mut f,
        &[
            metric("a", &[], MetricType::Gauge, 1.0),
            metric("b", &[], MetricType::Gauge, 1.0),
        ],
        s,
    );
    for (frame, _) in pack(&mut f, &[metric("a", &[], MetricType::Gauge, 2.0)], 20 * s) {
        decode(&mut dict, &sealed(&frame, 1)).unwrap();
    }
    assert_eq!(
        dict.known_up_to(),
        2,
        "b's definition came again on its own"
    );
    f.on_ack(dict.take_ack().unwrap());
    // A new series after the orphan is acknowledged as usual.
    for round in 0..2 {
        let metrics = [
            metric("a", &[], MetricType::Gauge, 3.0),
            metric("c", &[], MetricType::Gauge, 3.0),
        ];
        for (frame, expected) in pack(&mut f, &metrics, (30 + round) * s) {
            assert_eq!(decode(&mut dict, &sealed(&frame, 1)).unwrap(), expected);
        }
        f.on_ack(dict.take_ack().unwrap_or(0));
    }
    assert_eq!(f.acked(), 3);
}

#[test]
fn a_full_dictionary_sends_frame_local_definitions() {
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let mut dict = SeriesDict::new();
    // Fill the dictionary (definitions only need to be given out).
    for i in 0..MAX_DICT_ENTRIES {
        let m = metric("fill", &[("i", &i.to_string())], MetricType::Gauge, 0.0);
        let _ = f.push(&m, 1);
    }
    let _ = f.flush();
    f.on_ack(MAX_DICT_ENTRIES);
    let metrics = [
        metric("over", &[("k", "1")], MetricType::Gauge, 1.0),
        metric("fill", &[("i", "5")], MetricType::Gauge, 2.0),
        metric("over", &[("k", "2")], MetricType::Gauge, 3.0),
    ];
    let frames = pack(&mut f, &metrics, 2);
    // The collector knows id 5 (it acknowledged everything): teach it.
    let teach = pack(
        &mut DictFramer::new(1, 0, Limits::default()).unwrap(),
        &(0..6)
            .map(|i| metric("fill", &[("i", &i.to_string())], MetricType::Gauge, 0.0))
            .collect::<Vec<_>>(),
        1,
    );
    decode(&mut dict, &sealed(&teach[0].0, 1)).unwrap();
    for (frame, expected) in frames {
        assert_eq!(decode(&mut dict, &sealed(&frame, 1)).unwrap(), expected);
    }
    assert_eq!(dict.len(), 6, "frame-local series are not stored");
}

/// One step of the pair: which frames arrive, in which order, and when the collector's
/// acknowledgment reaches the agent.
fn pair(seed: u64, rounds: u64, loss: f64, dup: f64, reorder: f64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let limits = Limits {
        max_frame_bytes: 512,
        ..Limits::default()
    };
    let mut epoch = 1u64;
    let mut f = DictFramer::new(1, 0, limits.clone()).unwrap();
    let mut dict = SeriesDict::new();
    let mut acks: Vec<(u64, u32)> = Vec::new();
    let mut live: Vec<usize> = (0..30).collect();
    let mut next_series = 30usize;
    let mut delivered = 0usize;
    for round in 0..rounds {
        // Churn: series come and go every few rounds.
        if rng.gen_bool(0.3) {
            let n = rng.gen_range(1..5);
            for _ in 0..n {
                live.push(next_series);
                next_series += 1;
            }
        }
        if rng.gen_bool(0.3) && live.len() > 5 {
            let i = rng.gen_range(0..live.len());
            live.remove(i);
        }
        // An epoch change: a reconnect or a collector restart; both sides start empty.
        if rng.gen_bool(0.05) {
            epoch += 1;
            f = DictFramer::new(1, 0, limits.clone()).unwrap();
            dict = SeriesDict::new();
            acks.clear();
        }
        let metrics: Vec<Metric> = live
            .iter()
            .map(|s| {
                let kind = if s % 5 == 0 {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                };
                let mut m = metric(
                    &format!("series_{}", s % 7),
                    &[("s", &s.to_string())],
                    kind,
                    (*s as f64) * 1000.0 + round as f64,
                );
                if s % 11 == 0 {
                    m.timestamp_ms = 1_700_000_000_000 + round as i64;
                }
                m
            })
            .collect();
        let now = 1_700_000_000_000_000_000 + round * 10_000_000_000;
        let mut wire: Vec<(Vec<u8>, Vec<Metric>)> = Vec::new();
        for (frame, expected) in pack(&mut f, &metrics, now) {
            if rng.gen_bool(loss) {
                continue;
            }
            let bytes = sealed(&frame, epoch);
            if rng.gen_bool(dup) {
                wire.push((bytes.clone(), expected.clone()));
            }
            wire.push((bytes, expected));
        }
        if wire.len() > 1 && rng.gen_bool(reorder) {
            let (i, j) = (rng.gen_range(0..wire.len()), rng.gen_range(0..wire.len()));
            wire.swap(i, j);
        }
        for (bytes, expected) in &wire {
            // Every frame that arrives decodes, with exactly its own samples under their
            // own names: never an unknown id, never a sample under a wrong series.
            let got = decode(&mut dict, bytes)
                .unwrap_or_else(|e| panic!("seed {seed} round {round}: a frame failed: {e}"));
            assert_eq!(&got, expected, "seed {seed} round {round}");
            delivered += got.len();
        }
        // The acknowledgment travels on the control channel: it arrives a round or two
        // later (never before the definitions it names were received).
        if let Some(ack) = dict.take_ack() {
            acks.push((round + rng.gen_range(0..3), ack));
        }
        acks.retain(|(at, ack)| {
            if *at <= round {
                f.on_ack(*ack);
                false
            } else {
                true
            }
        });
    }
    assert!(delivered > 0);
}

#[test]
fn pair_under_loss_duplication_reordering_churn_and_epoch_changes() {
    for seed in 0..40 {
        pair(seed, 60, 0.2, 0.1, 0.5);
    }
}

/// A dictionary that received the definitions of `known` gauges (ids 0 to `known` − 1).
fn seeded(known: u32) -> SeriesDict {
    let mut dict = SeriesDict::new();
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let seed: Vec<Metric> = (0..known)
        .map(|i| metric("k", &[("i", &i.to_string())], MetricType::Gauge, 1.0))
        .collect();
    for (frame, _) in pack(&mut f, &seed, 1) {
        decode(&mut dict, &sealed(&frame, 1)).unwrap();
    }
    dict
}

proptest! {
    #[test]
    fn the_pair_holds_for_any_seed(seed in any::<u64>(), loss in 0.0f64..0.5) {
        pair(seed, 30, loss, 0.2, 0.5);
    }

    #[test]
    fn any_body_is_refused_or_decoded_without_panic(
        body in proptest::collection::vec(any::<u8>(), 0..300),
        known in 0u32..4,
    ) {
        let mut dict = seeded(known);
        let before = dict.known_up_to();
        let mut with_version = vec![DICT_BODY_VERSION];
        with_version.extend_from_slice(&body);
        for b in [&body, &with_version] {
            let mut batch = MetricBatchView::new();
            match dict.decode_into(b, 1, &Limits::default(), &mut batch) {
                Ok(()) => {
                    for m in batch.iter() {
                        prop_assert!(crate::payload::validate_metric(&m.to_metric(), &Limits::default()).is_ok());
                    }
                }
                Err(_) => prop_assert!(batch.is_empty()),
            }
            drop(batch);
        }
        prop_assert!(dict.known_up_to() >= before);
    }
}

/// `(id, type, value bits, timestamp)` of each value, so that NaN compares by its bits.
fn known_bits(values: &[KnownValue]) -> Vec<(crate::borrowed::RecordId, i32, u64, i64)> {
    values
        .iter()
        .map(|v| (v.id, v.r#type, v.value.to_bits(), v.timestamp_ms))
        .collect()
}

/// What [`SeriesDict::decode_into`] gives for `body`, as [`known_bits`]; `None` when it
/// refuses the body or a record has no id.
fn views_bits(
    dict: &mut SeriesDict,
    body: &[u8],
    ts: u64,
) -> Option<Vec<(crate::borrowed::RecordId, i32, u64, i64)>> {
    let mut batch = MetricBatchView::new();
    dict.decode_into(body, ts, &Limits::default(), &mut batch)
        .ok()?;
    batch
        .iter_with_ids()
        .map(|(m, id)| Some((id?, m.r#type, m.value.to_bits(), m.timestamp_ms)))
        .collect()
}

#[test]
fn known_values_are_what_the_views_hold_once_acknowledged() {
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let mut dict = SeriesDict::new();
    let now = 1_700_000_000_000_000_000;
    let mut out = Vec::new();
    let mut taken = 0;
    for round in 0..3u64 {
        let mut metrics = collection(120, round);
        // Own timestamps before and after the frame's, and odd values.
        metrics[3].timestamp_ms = 1_699_999_999_000;
        metrics[5].timestamp_ms = 1_700_000_000_250;
        metrics[7].value = f64::NAN;
        metrics[9].value = -0.0;
        for (frame, expected) in pack(&mut f, &metrics, now + round) {
            let bytes = sealed(&frame, 1);
            let frame = Frame::new_checked(&bytes[..]).unwrap();
            let (body, ts) = (frame.payload(), frame.timestamp_ns());
            let known = dict.decode_known(body, ts, &Limits::default(), &mut out);
            let views = views_bits(&mut dict, body, ts).expect("decodes");
            if round == 0 {
                // The definitions travel until acknowledged: the full path takes them.
                assert!(!known && out.is_empty(), "round 0");
                continue;
            }
            assert!(known, "round {round}: every series is acknowledged");
            assert_eq!(known_bits(&out), views, "round {round}");
            assert_eq!(out.len(), expected.len());
            taken += out.len();
        }
        if let Some(ack) = dict.take_ack() {
            f.on_ack(ack);
        }
    }
    assert_eq!(taken, 2 * 120);
}

#[test]
fn known_values_refuse_what_is_not_plain_and_known() {
    let mut f = DictFramer::new(1, 0, Limits::default()).unwrap();
    let mut dict = SeriesDict::new();
    let limits = Limits::default();
    let ms = vec![
        metric("g", &[("i", "0")], MetricType::Gauge, 1.0),
        metric("g", &[("i", "1")], MetricType::Gauge, 2.0),
        histogram("h", [1, 2, 3], 4, 0.5),
    ];
    for (frame, _) in pack(&mut f, &ms, 1) {
        decode(&mut dict, &sealed(&frame, 1)).unwrap();
    }
    f.on_ack(dict.take_ack().unwrap());
    let mut out = Vec::new();
    // Ids 0 and 1, the gauges: taken.
    let gauges = [DICT_BODY_VERSION, OP_UINT, 5, OP_UINT, 6];
    assert!(dict.decode_known(&gauges, 1, &limits, &mut out));
    assert_eq!(out.iter().map(|v| v.value).collect::<Vec<_>>(), [5.0, 6.0]);
    // An unknown id (3) after a known one: refused whole, and the full path says why.
    let unknown = [DICT_BODY_VERSION, OP_UINT, 5, (4 << 4) | OP_UINT, 6];
    assert!(!dict.decode_known(&unknown, 1, &limits, &mut out));
    assert!(out.is_empty());
    let mut batch = MetricBatchView::new();
    assert!(matches!(
        dict.decode_into(&unknown, 1, &limits, &mut batch),
        Err(PayloadError::Dictionary(DictError::UnknownSeries { id: 3 }))
    ));
    drop(batch);
    // A body cut inside a record: refused, and by the full path too.
    let mut f64s = vec![DICT_BODY_VERSION, OP_F64];
    f64s.extend_from_slice(&2.5f64.to_le_bytes());
    f64s.push(OP_F64);
    f64s.extend_from_slice(&(-7.25f64).to_le_bytes());
    assert!(dict.decode_known(&f64s, 2, &limits, &mut out));
    assert_eq!(
        out.iter().map(|v| v.value).collect::<Vec<_>>(),
        [2.5, -7.25]
    );
    for cut in (0..f64s.len()).filter(|c| ![1, 10].contains(c)) {
        let short = &f64s[..cut];
        assert!(!dict.decode_known(short, 2, &limits, &mut out), "cut {cut}");
        assert!(out.is_empty());
        let mut batch = MetricBatchView::new();
        assert!(dict.decode_into(short, 2, &limits, &mut batch).is_err());
    }
    // The histogram (id 2): the full path builds its buckets.
    let h = pack(&mut f, &ms[2..], 3);
    let bytes = sealed(&h[0].0, 1);
    let body = Frame::new_checked(&bytes[..]).unwrap().payload().to_vec();
    assert!(!dict.decode_known(&body, 3, &limits, &mut out));
    assert!(decode(&mut dict, &bytes).is_ok());
    // Over the record bound: refused.
    let tight = Limits {
        max_records_per_frame: 1,
        ..Limits::default()
    };
    assert!(!dict.decode_known(&gauges, 1, &tight, &mut out));
    assert!(out.is_empty());
}

proptest! {
    /// Whatever body [`SeriesDict::decode_known`] takes, [`SeriesDict::decode_into`] takes
    /// too and reads the same values: the fast path never stores what the full path would
    /// refuse, nor another value.
    #[test]
    fn known_values_take_only_what_the_views_take(
        body in proptest::collection::vec(any::<u8>(), 0..200),
        known in 0u32..6,
    ) {
        let mut dict = seeded(known);
        let mut with_version = vec![DICT_BODY_VERSION];
        with_version.extend_from_slice(&body);
        let mut out = Vec::new();
        for b in [&body, &with_version] {
            if dict.decode_known(b, 1_700_000_000_000_000_000, &Limits::default(), &mut out) {
                let views = views_bits(&mut dict, b, 1_700_000_000_000_000_000);
                prop_assert_eq!(Some(known_bits(&out)), views);
            } else {
                prop_assert!(out.is_empty());
            }
        }
    }
}
