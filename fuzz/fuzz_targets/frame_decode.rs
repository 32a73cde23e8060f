//! `decode_frame` on arbitrary bytes: header checks, CRC32C and payload decode must never
//! panic, and anything accepted must survive a rebuild unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_protocol::frame::{
    build_frame, decode_frame, peek_conn_seq, verify_frame, Frame, FrameHeader, FrameKind, Payload,
    HEADER_LEN,
};
use uctel_protocol::limits::Limits;
use uctel_protocol::payload::{encode_log_batch, encode_metric_batch};

fuzz_target!(|data: &[u8]| {
    check(data);
    // Random bytes rarely carry a matching CRC32C: also wrap the input, as a payload, in a
    // valid header so the payload path behind the CRC gets explored too.
    if let Some((&selector, payload)) = data.split_first() {
        let kind = match selector % 3 {
            0 => FrameKind::Metrics,
            1 => FrameKind::Logs,
            _ => FrameKind::Heartbeat,
        };
        let header = FrameHeader::new(kind, u32::from(selector));
        if let Ok(frame) = build_frame(&header, payload) {
            check(&frame);
        }
    }
});

fn check(data: &[u8]) {
    let limits = Limits::default();
    let _ = peek_conn_seq(data);
    if let Ok(frame) = Frame::new_checked(data) {
        // Every accessor of a checked view is panic-free.
        let _ = (
            frame.header(),
            frame.payload(),
            frame.as_bytes(),
            frame.check_crc(),
        );
    }
    let _ = verify_frame(data);
    if let Ok(decoded) = decode_frame(data, &limits) {
        let rebuilt = rebuild(&decoded.header, &decoded.payload);
        // Canonical re-encoding is never longer than its input, but do not rely on it here.
        let roomy = Limits {
            max_frame_bytes: usize::MAX,
            ..Limits::default()
        };
        let again = decode_frame(&rebuilt, &roomy).expect("a rebuilt frame decodes");
        let want = FrameHeader {
            payload_len: (rebuilt.len() - HEADER_LEN) as u32,
            ..decoded.header
        };
        assert_eq!(again.header, want);
        // Payloads may hold NaN, which never compares equal: compare encodings.
        assert_eq!(rebuild(&again.header, &again.payload), rebuilt);
    }
}

fn rebuild(header: &FrameHeader, payload: &Payload) -> Vec<u8> {
    let body = match payload {
        Payload::Metrics(b) => encode_metric_batch(b),
        Payload::Logs(b) => encode_log_batch(b),
        Payload::Heartbeat => Vec::new(),
        Payload::Samples(b) => uctel_protocol::samples::encode_sample_batch(b),
    };
    build_frame(header, &body).expect("payload fits u32")
}
