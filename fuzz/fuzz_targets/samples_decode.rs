//! The samples payload codec (`fast_counters` stream) on arbitrary bytes: protobuf decode,
//! name grammar, series shape and limit checks must never panic, and an accepted batch must
//! re-encode to bytes that decode to the same batch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_protocol::limits::Limits;
use uctel_protocol::samples::{batch_weight, decode_sample_batch, encode_sample_batch};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let roomy = Limits {
        max_frame_bytes: usize::MAX,
        ..Limits::default()
    };
    if let Ok(batch) = decode_sample_batch(data, &limits) {
        let _ = batch_weight(&batch);
        let bytes = encode_sample_batch(&batch);
        let again = decode_sample_batch(&bytes, &roomy).expect("re-encoded sample batch decodes");
        // NaN values never compare equal; compare the re-encoded bytes instead.
        assert_eq!(encode_sample_batch(&again), bytes);
    }
});
