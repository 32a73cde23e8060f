//! Series-dictionary frames through a connection's ingest: decoded with the stream's
//! dictionary, acknowledged once per advance, and accounted as any metrics frame.

use super::test_support::*;
use super::{DictAckOutbox, FrameOutcome};
use crate::telemetry::DropReason;
use uctel_protocol::dict::DictFramer;
use uctel_protocol::framer::{BuiltFrame, PushOutcome};

fn metrics(round: u64) -> Vec<Metric> {
    (0..40)
        .map(|i| Metric {
            name: "node_network_receive_bytes_total".into(),
            help: "Network device statistic receive_bytes.".into(),
            r#type: MetricType::Counter as i32,
            labels: vec![payload::Label {
                name: "device".into(),
                value: format!("eth{i}"),
            }],
            value: (1_000 * i + round) as f64,
            ..Default::default()
        })
        .collect()
}

pub(super) fn pack(f: &mut DictFramer, ms: &[Metric], now_ns: u64) -> Vec<BuiltFrame> {
    let mut out = Vec::new();
    for m in ms {
        if let PushOutcome::Closed(frame) = f.push(m, now_ns) {
            out.push(frame);
        }
    }
    out.extend(f.flush());
    out
}

fn render(r: &Rig) -> String {
    render_store(&r.store)
}

/// The exposition of `store` alone.
pub(super) fn render_store(store: &SeriesStore) -> String {
    let registry = prometheus::Registry::new();
    registry.register(Box::new(store.collector())).unwrap();
    let mut buf = Vec::new();
    prometheus::Encoder::encode(
        &prometheus::TextEncoder::new(),
        &registry.gather(),
        &mut buf,
    )
    .unwrap();
    String::from_utf8(buf).unwrap()
}

#[test]
fn dictionary_frames_are_stored_acknowledged_and_accounted_under_loss_and_reordering() {
    let mut r = rig();
    let outbox = DictAckOutbox::default();
    r.ingest.set_dict_acks(outbox.clone());
    let limits = Limits {
        max_frame_bytes: 256,
        ..Limits::default()
    };
    let mut agent = DictFramer::new(1, 0, limits).unwrap();
    let mut conn = 0u64;
    let mut sent = 0u64;
    let mut records = 0u64;
    for round in 0..3u64 {
        let frames = pack(
            &mut agent,
            &metrics(round),
            1_700_000_000_000_000_000 + round,
        );
        assert!(!frames.is_empty());
        let mut wire = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let bytes = f.clone().into_stamped(EPOCH, conn);
            conn += 1;
            sent = f.stream_seq();
            records = f.record_count();
            // Round 0 loses its first frame (the definitions of its series among them).
            if round == 0 && i == 0 {
                continue;
            }
            wire.push(bytes);
        }
        // Reordered and duplicated.
        if wire.len() > 1 {
            wire.swap(0, 1);
        }
        wire.push(wire[0].clone());
        for bytes in &wire {
            let out = r.ingest.on_send(bytes, now());
            assert!(
                matches!(out, FrameOutcome::Accepted { .. } | FrameOutcome::Duplicate),
                "round {round}: {out:?}"
            );
        }
        let _ = r.ingest.report();
        for ack in outbox.take() {
            assert_eq!((ack.epoch, ack.stream_id), (EPOCH, 1));
            agent.on_ack(ack.known_up_to);
        }
        assert_eq!(outbox.take(), vec![], "one acknowledgment per advance");
    }
    // Round 0 lost the definitions of its first frame: they came again in round 1, and
    // everything was acknowledged after it; round 2 went out as values only.
    assert_eq!(agent.acked(), 40);
    let text = render(&r);
    for i in 0..40u64 {
        let line = format!(
            "node_network_receive_bytes_total{{agent=\"a1\",device=\"eth{i}\",instance=\"host-a1\"}} {}",
            1_000 * i + 2
        );
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    let summary = r.ingest.close(&Goodbye {
        final_conn_seq: Some(conn - 1),
        streams: vec![StreamFinal {
            stream_id: 1,
            final_stream_seq: Some(sent),
            final_record_count: records,
        }],
        ..Default::default()
    });
    let (_, l) = summary.streams.iter().find(|(id, _)| *id == 1).unwrap();
    assert_eq!(l.accepted + l.lost + l.dropped_after_tracking, sent + 1);
    assert_eq!(l.lost, 1);
    assert_eq!(l.records_received + l.records_lost, records);
}

#[test]
fn a_reference_to_a_series_the_collector_does_not_know_is_a_malformed_payload() {
    let mut r = rig();
    let mut agent = DictFramer::new(1, 0, Limits::default()).unwrap();
    let _ = pack(&mut agent, &metrics(0), 1);
    // An acknowledgment this connection never gave (a misbehaving agent).
    agent.on_ack(40);
    let frames = pack(&mut agent, &metrics(1), 2);
    let out = r
        .ingest
        .on_send(&frames[0].clone().into_stamped(EPOCH, 0), now());
    assert_eq!(out, FrameOutcome::Dropped(DropReason::MalformedPayload));
    assert_eq!(r.store.series_count("a1"), 0);
}

#[test]
fn no_acknowledgment_without_an_outbox() {
    let mut r = rig();
    let mut agent = DictFramer::new(1, 0, Limits::default()).unwrap();
    for (c, f) in pack(&mut agent, &metrics(0), 1).into_iter().enumerate() {
        let out = r.ingest.on_send(&f.into_stamped(EPOCH, c as u64), now());
        assert!(matches!(out, FrameOutcome::Accepted { .. }));
    }
    assert_eq!(r.store.series_count("a1"), 40);
    let _ = r.ingest.report();
    // Taken by nobody: an agent that did not ask gets no `DictAck`; the ingest still
    // knows what it would acknowledge.
    assert_eq!(r.ingest.take_dict_acks().len(), 1);
}
