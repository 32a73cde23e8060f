//! Series-dictionary frames stored by id (`deliver_metrics_dict`'s shorter way): the same
//! series, values and accounting as the full decode, and nothing stored that way from a
//! frame the full decode refuses.

use super::dict_tests::{pack, render_store as render};
use super::test_support::*;
use super::{Delivery, FrameOutcome};
use crate::logsink::LogContext;
use crate::outputs::Outputs;
use crate::store::IngestOutcome;
use crate::telemetry::DropReason;
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::dict::{DictFramer, KnownValue};
use uctel_protocol::samples::SampleBatch;

/// The collector's outputs, with the way by id allowed (`by_id`) or not, counting the
/// frames stored that way.
struct Counted {
    outputs: Outputs,
    by_id: bool,
    frames_by_id: u64,
}

impl Delivery for Counted {
    fn metrics(
        &mut self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        batch: &MetricBatchView<'_>,
        now: Instant,
    ) -> IngestOutcome {
        self.outputs
            .metrics(agent, instance, frame_timestamp_ns, batch, now)
    }

    fn takes_known(&self) -> bool {
        self.by_id && self.outputs.takes_known()
    }

    fn metrics_known(
        &mut self,
        agent: &str,
        instance: &str,
        frame_timestamp_ns: u64,
        values: &[KnownValue],
        now: Instant,
    ) -> Option<IngestOutcome> {
        let out = self
            .outputs
            .metrics_known(agent, instance, frame_timestamp_ns, values, now);
        self.frames_by_id += u64::from(out.is_some());
        out
    }

    fn samples(
        &mut self,
        agent: &str,
        instance: &str,
        batch: &SampleBatch,
        now: Instant,
    ) -> IngestOutcome {
        self.outputs.samples(agent, instance, batch, now)
    }

    fn logs(
        &mut self,
        ctx: &LogContext<'_>,
        records: &[payload::LogRecord],
    ) -> (u64, Option<std::io::Error>) {
        self.outputs.logs(ctx, records)
    }

    fn series_count(&self, agent: &str) -> usize {
        self.outputs.series_count(agent)
    }
}

struct Side {
    ingest: ConnectionIngest<Counted>,
    store: SeriesStore,
    telemetry: Telemetry,
}

fn side(by_id: bool) -> Side {
    let telemetry = Telemetry::new().unwrap();
    let store = SeriesStore::new(Duration::from_secs(60), 1000);
    let logs = stdout_logs();
    let ingest = ConnectionIngest::with_delivery(
        "a1",
        "host-a1",
        EPOCH,
        Limits::default(),
        TrackerConfig::default(),
        Counted {
            outputs: Outputs::new(store.clone(), logs),
            by_id,
            frames_by_id: 0,
        },
        telemetry.agent("a1"),
    )
    .unwrap();
    Side {
        ingest,
        store,
        telemetry,
    }
}

/// Counters, gauges (some with their own time, some odd values) and a histogram.
fn collection(round: u64) -> Vec<Metric> {
    let mut out: Vec<Metric> = (0..30u64)
        .map(|i| Metric {
            name: if i % 3 == 0 {
                "node_load1".into()
            } else {
                "node_network_receive_bytes_total".into()
            },
            r#type: if i % 3 == 0 {
                MetricType::Gauge as i32
            } else {
                MetricType::Counter as i32
            },
            labels: vec![payload::Label {
                name: "device".into(),
                value: format!("eth{i}"),
            }],
            value: match i {
                4 => -2.5 * round as f64,
                5 => 0.1 + round as f64,
                _ => (1_000 * i + round) as f64,
            },
            timestamp_ms: if i == 7 { 1_700_000_000_500 } else { 0 },
            ..Default::default()
        })
        .collect();
    out.push(Metric {
        name: "node_h".into(),
        r#type: MetricType::Histogram as i32,
        buckets: vec![payload::Bucket {
            upper_bound: 1.0,
            cumulative_count: round,
        }],
        count: round + 1,
        sum: 0.5,
        ..Default::default()
    });
    out
}

fn received(s: &Side) -> u64 {
    s.telemetry.agent("a1").stream(1).records_received.get()
}

/// The same frames through both ways, after an agent whose definitions were all
/// acknowledged: the same exposition, the same records, and the frames of values only
/// (without the histogram) stored by id.
fn steady(limits: Limits) -> (Side, Side, DictFramer, u64) {
    let (mut fast, mut full) = (side(true), side(false));
    let mut agent = DictFramer::new(1, 0, limits).unwrap();
    let mut conn = 0u64;
    for round in 0..4u64 {
        let ms = collection(round);
        // Round 2 and on: the histogram goes in a frame of its own (the full path).
        let (plain, hist) = ms.split_at(30);
        let mut frames = pack(&mut agent, plain, 1_700_000_000_000_000_000 + round);
        frames.extend(pack(&mut agent, hist, 1_700_000_000_000_000_000 + round));
        for f in frames {
            let bytes = f.into_stamped(EPOCH, conn);
            conn += 1;
            for s in [&mut fast, &mut full] {
                let out = s.ingest.on_send(&bytes, now());
                assert!(matches!(out, FrameOutcome::Accepted { .. }), "{out:?}");
            }
        }
        for a in fast.ingest.take_dict_acks() {
            agent.on_ack(a.known_up_to);
        }
        let _ = full.ingest.take_dict_acks();
        assert_eq!(render(&fast.store), render(&full.store), "round {round}");
    }
    (fast, full, agent, conn)
}

#[test]
fn frames_of_known_ids_store_what_the_full_decode_stores() {
    let (fast, full, _, _) = steady(Limits::default());
    // Round 0 defines every series. Round 1's values are known to the dictionary, but the
    // store's memo of their ids is stale (the histogram's series, added after them in
    // round 0, moved the others): the full path stores them and notes them again. Rounds
    // 2 and 3 go by id, one frame each.
    assert_eq!(fast.ingest.delivery().frames_by_id, 2);
    assert_eq!(full.ingest.delivery().frames_by_id, 0);
    assert_eq!(received(&fast), received(&full));
    assert_eq!(received(&fast), 4 * 31);
    let text = render(&fast.store);
    for line in [
        "node_load1{agent=\"a1\",device=\"eth0\",instance=\"host-a1\"} 3",
        "node_network_receive_bytes_total{agent=\"a1\",device=\"eth4\",instance=\"host-a1\"} -7.5",
        "node_network_receive_bytes_total{agent=\"a1\",device=\"eth7\",instance=\"host-a1\"} 7003 1700000000500",
        "node_h_count{agent=\"a1\",instance=\"host-a1\"} 4",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

/// `body` as the payload of a frame like `like` (its sequences and record count).
fn with_body(like: &[u8], body: &[u8]) -> Vec<u8> {
    let header = FrameHeader::parse(like).unwrap();
    build_frame(&header, body).unwrap()
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[test]
fn an_unknown_id_or_a_cut_body_among_known_values_stores_nothing_and_is_counted() {
    let (mut fast, _, mut agent, mut conn) = steady(Limits::default());
    let before = render(&fast.store);
    let mut frames = Vec::new();
    for round in 9..12u64 {
        let f = pack(
            &mut agent,
            &collection(round)[..30],
            1_700_000_000_000_000_000 + round,
        );
        assert_eq!(f.len(), 1);
        frames.push(f[0].clone().into_stamped(EPOCH, conn));
        conn += 1;
    }
    let payload = |bytes: &[u8]| {
        uctel_protocol::frame::Frame::new_checked(bytes)
            .unwrap()
            .payload()
            .to_vec()
    };
    // Known values (ids 0 to 29), then a value of id 500, which the dictionary does not
    // hold (key: zigzag(500 − 30) << 4 | op 1, an unsigned integer).
    let mut unknown = payload(&frames[0]);
    varint(((2 * (500 - 30)) << 4) | 1, &mut unknown);
    unknown.push(5);
    // Cut inside the last record (id 29's value, a two-byte varint).
    let body = payload(&frames[1]);
    let cut = &body[..body.len() - 1];
    let received_before = received(&fast);
    for (what, bytes) in [
        ("unknown id", with_body(&frames[0], &unknown)),
        ("cut", with_body(&frames[1], cut)),
    ] {
        let out = fast.ingest.on_send(&bytes, now());
        assert_eq!(
            out,
            FrameOutcome::Dropped(DropReason::MalformedPayload),
            "{what}"
        );
        assert_eq!(render(&fast.store), before, "{what}: nothing stored");
    }
    assert_eq!(fast.ingest.delivery().frames_by_id, 2);
    assert_eq!(received(&fast), received_before);
    // The next frame of known values goes by id again, stored once.
    let out = fast.ingest.on_send(&frames[2], now());
    assert_eq!(out, FrameOutcome::Accepted { records: 30 });
    assert_eq!(fast.ingest.delivery().frames_by_id, 3);
    assert_eq!(received(&fast), received_before + 30);
    let text = render(&fast.store);
    let line =
        "node_network_receive_bytes_total{agent=\"a1\",device=\"eth1\",instance=\"host-a1\"} 1011";
    assert!(text.contains(line), "{line} in\n{text}");
    let l = fast.ingest.ledger();
    let (_, stream) = l.iter().find(|(id, _)| *id == 1).unwrap();
    assert_eq!(stream.dropped_after_tracking, 2, "{stream:?}");
    // Their 60 records are the stream's records lost (the `account` step's rule).
    assert_eq!(
        fast.telemetry
            .agent("a1")
            .frames_dropped(DropReason::MalformedPayload),
        2
    );
}
