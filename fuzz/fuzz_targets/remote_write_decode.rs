//! `prompb::decode_request` (snappy, then a Prometheus remote-write `WriteRequest`) on
//! arbitrary bytes: it must never panic, and an accepted request must encode again (prost,
//! snappy) to a body that decodes to the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use uctel_collector::outputs::remote_write::prompb::decode_request;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = decode_request(data) else {
        return;
    };
    let body = snap::raw::Encoder::new()
        .compress_vec(&request.encode_to_vec())
        .expect("snappy compresses a decoded request");
    let again = decode_request(&body).expect("a re-encoded request decodes");
    // NaN sample values never compare equal; compare the protobuf bytes instead.
    assert_eq!(again.encode_to_vec(), request.encode_to_vec());
});
