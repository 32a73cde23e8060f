//! The borrowed metrics decoder (`MetricBatchView`, the collector's hot path) against the
//! owned one on arbitrary bytes: neither may panic, and they must agree, the same error for
//! the same input or the same batch (module documentation of `uctel_protocol::borrowed`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_protocol::borrowed::MetricBatchView;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{decode_metric_batch, encode_metric_batch};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let view = MetricBatchView::decode(data, &limits);
    let owned = decode_metric_batch(data, &limits);
    match (view, owned) {
        (Ok(view), Ok(owned)) => {
            assert_eq!(view.len(), owned.metrics.len());
            for m in view.iter() {
                let _ = m.to_metric();
            }
            // NaN values never compare equal; compare the encoded bytes instead.
            assert_eq!(
                encode_metric_batch(&view.to_batch()),
                encode_metric_batch(&owned)
            );
        }
        // Compared as text: an error may carry a NaN bound, which never compares equal.
        (Err(a), Err(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (view, owned) => panic!(
            "the decoders disagree: view {:?}, owned {:?}",
            view.map(|v| v.len()),
            owned.map(|b| b.metrics.len())
        ),
    }
});
