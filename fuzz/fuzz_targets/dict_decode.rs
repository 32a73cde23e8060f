//! The series-dictionary body (`kind = metrics_dict`, `uctel_protocol::dict`) on arbitrary
//! bytes, against a dictionary that knows a few series: decoding never panics, a refused
//! body changes nothing (the same body refused again, the known prefix unchanged), an
//! accepted one yields only valid records, decodes again to the same records (a duplicate
//! frame), and its records framed anew by a fresh `DictFramer` decode to the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::dict::{DictFramer, SeriesDict};
use uctel_protocol::framer::PushOutcome;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{validate_metric, Label, Metric, MetricType};

fn decode(dict: &mut SeriesDict, body: &[u8], limits: &Limits) -> Option<Vec<Metric>> {
    let mut batch = MetricBatchView::new();
    dict.decode_into(body, 1_700_000_000_000_000_000, limits, &mut batch)
        .ok()
        .map(|()| batch.iter().map(|m| m.to_metric()).collect())
}

fn bits(ms: &[Metric]) -> Vec<(String, Vec<Label>, u64, i64)> {
    ms.iter()
        .map(|m| (m.name.clone(), m.labels.clone(), m.value.to_bits(), m.timestamp_ms))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&known, body)) = data.split_first() else {
        return;
    };
    let limits = Limits::default();
    let mut dict = SeriesDict::new();
    let mut framer = DictFramer::new(1, 0, limits.clone()).expect("default limits");
    for i in 0..u32::from(known % 8) {
        let m = Metric {
            name: "known".into(),
            r#type: MetricType::Gauge as i32,
            labels: vec![Label {
                name: "i".into(),
                value: i.to_string(),
            }],
            ..Metric::default()
        };
        let _ = framer.push(&m, 1);
    }
    if let Some(frame) = framer.flush() {
        let header = uctel_protocol::limits::HEADER_LEN;
        decode(&mut dict, &frame.bytes()[header..], &limits).expect("own frame decodes");
    }
    let before = dict.known_up_to();
    match decode(&mut dict, body, &limits) {
        None => {
            assert_eq!(dict.known_up_to(), before);
            assert!(decode(&mut dict, body, &limits).is_none());
        }
        Some(metrics) => {
            for m in &metrics {
                validate_metric(m, &limits).expect("an accepted record is valid");
            }
            let again = decode(&mut dict, body, &limits).expect("a duplicate decodes");
            assert_eq!(bits(&again), bits(&metrics));
            let mut fresh = DictFramer::new(1, 0, limits.clone()).expect("default limits");
            let mut other = SeriesDict::new();
            let mut out = Vec::new();
            let mut frames = Vec::new();
            for m in &metrics {
                match fresh.push(m, 1_700_000_000_000_000_000) {
                    PushOutcome::Closed(f) => frames.push(f),
                    PushOutcome::Appended => {}
                    PushOutcome::Rejected(_) => return,
                }
            }
            frames.extend(fresh.flush());
            for f in &frames {
                let header = uctel_protocol::limits::HEADER_LEN;
                out.extend(decode(&mut other, &f.bytes()[header..], &limits).expect("reframed"));
            }
            assert_eq!(bits(&out), bits(&metrics));
        }
    }
});
