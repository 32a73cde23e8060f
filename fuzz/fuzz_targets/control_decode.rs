//! The control-plane decoder on arbitrary bytes, as a TCP peer would send them: the stream
//! decoder (any chunking) and `decode_frame` must never panic, must agree with each other,
//! and every accepted message must pass validation and re-encode to bytes that decode to the
//! same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_protocol::control::{decode_frame, encode_message, ControlDecoder, ControlMessage};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunk size the stream decoder is fed with.
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = ControlDecoder::new();
    let mut streamed = Vec::new();
    let mut failed = false;
    'feed: for piece in stream.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_message() {
                Ok(Some(m)) => streamed.push(m),
                Ok(None) => break,
                // The framing is lost: a connection would be closed here.
                Err(_) => {
                    failed = true;
                    break 'feed;
                }
            }
        }
    }
    if !failed {
        let _ = decoder.finish();
    }
    // The one-shot decoder reads the same messages from the front of the buffer.
    let mut rest = stream;
    let mut oneshot = Vec::new();
    while let Ok((m, used)) = decode_frame(rest) {
        assert!(used >= 4 && used <= rest.len());
        oneshot.push(m);
        rest = &rest[used..];
    }
    assert_eq!(oneshot.len(), streamed.len());
    for (a, b) in oneshot.iter().zip(&streamed) {
        assert_eq!(a, b);
        check(a);
    }
});

fn check(msg: &ControlMessage) {
    assert!(
        msg.validate().is_ok(),
        "a decoded message passed validation"
    );
    let mut bytes = Vec::new();
    encode_message(msg, &mut bytes).expect("an accepted message re-encodes");
    let (again, used) = decode_frame(&bytes).expect("a re-encoded message decodes");
    assert_eq!(used, bytes.len());
    assert_eq!(&again, msg);
}
