//! The payload codec on arbitrary bytes (no frame header, so no CRC in the way): protobuf
//! decode, UTF-8, grammar and limit checks must never panic, and an accepted batch must
//! re-encode to bytes that decode to the same batch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{
    decode_log_batch, decode_metric_batch, encode_log_batch, encode_metric_batch,
};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    // Canonical re-encoding is never longer than its input, but do not rely on it here.
    let roomy = Limits {
        max_frame_bytes: usize::MAX,
        ..Limits::default()
    };
    if let Ok(batch) = decode_metric_batch(data, &limits) {
        let again = decode_metric_batch(&encode_metric_batch(&batch), &roomy);
        // NaN values never compare equal; compare the re-encoded bytes instead.
        let again = again.expect("re-encoded metric batch decodes");
        assert_eq!(encode_metric_batch(&again), encode_metric_batch(&batch));
    }
    if let Ok(batch) = decode_log_batch(data, &limits) {
        let again = decode_log_batch(&encode_log_batch(&batch), &roomy);
        assert_eq!(again.expect("re-encoded log batch decodes"), batch);
    }
});
