//! Control-plane framing, validation and proof tests.

use bytes::BytesMut;
use proptest::prelude::*;
use uctel_protocol::control::{
    decode_frame, encode_message, proof, random_nonce, verify_proof, Body, Challenge,
    ControlDecoder, ControlMessage, DataPath, DecodeError, EncodeError, Goodbye, GoodbyeReason,
    Heartbeat, Hello, LaneReport, Proof, QpEndpoint, RcLane, RcLaneRequest, Refuse, RefuseReason,
    Report, StreamFinal, StreamReport, Transport, Welcome, LENGTH_PREFIX_BYTES,
    MAX_CONTROL_MESSAGE_BYTES, NONCE_BYTES, PROTOCOL_VERSION,
};

fn qp(udp_addr: &str) -> QpEndpoint {
    QpEndpoint {
        gid: vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
        qpn: 0x11,
        psn: 0xab_cdef,
        mtu: 1024,
        udp_addr: udp_addr.to_owned(),
    }
}

fn hello() -> Hello {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: "agent-01".into(),
        hostname: "host-a.example".into(),
        epoch: 0x0123_4567_89ab_cdef,
        transport: Transport::Soft as i32,
        capabilities: vec![DataPath::WriteWithImm as i32, DataPath::Send as i32],
        qp: Some(qp("10.0.0.7:4791")),
        ..Default::default()
    }
}

fn rc_hello() -> Hello {
    Hello {
        rc_lane: Some(RcLaneRequest {
            qp: Some(QpEndpoint {
                qpn: 0x12,
                ..qp("10.0.0.7:4792")
            }),
            stream_ids: vec![2],
        }),
        ..hello()
    }
}

fn rc_welcome() -> Welcome {
    Welcome {
        rc_lane: Some(RcLane {
            qp: Some(qp("[fe80::1]:4793")),
            ring_addr: 0x7f00_beef_0000,
            rkey: 0x5678,
            slots: 256,
            credit_window: 256,
        }),
        ..welcome()
    }
}

fn welcome() -> Welcome {
    Welcome {
        qp: Some(qp("[fe80::1]:4791")),
        ring_addr: 0x7f00_dead_b000,
        rkey: 0x1234,
        slots: 1024,
        slot_bytes: 4096,
        max_frame_bytes: 1024,
        credit_window: 960,
        heartbeat_interval_ms: 1000,
        report_interval_ms: 5000,
        data_path: DataPath::WriteWithImm as i32,
        ..Default::default()
    }
}

/// One valid example of every message.
fn every_message() -> Vec<ControlMessage> {
    vec![
        hello().into(),
        rc_hello().into(),
        rc_welcome().into(),
        Heartbeat {
            sequence: 44,
            sent_conn_seq: Some(7),
            rc_sent_conn_seq: Some(3),
            rc_frames_without_credit: Some(2),
            ..Default::default()
        }
        .into(),
        Report {
            rc_lane: Some(LaneReport {
                consumed_conn_seq: Some(9),
                conn_received: 10,
                conn_lost: 0,
                conn_loss_fraction: 0.0,
            }),
            ..Default::default()
        }
        .into(),
        Challenge {
            nonce: (0..32).collect(),
            collector_id: "collector-1".into(),
        }
        .into(),
        Proof {
            hmac: vec![0x5a; 32],
        }
        .into(),
        welcome().into(),
        Refuse {
            reason: RefuseReason::BadProof as i32,
            detail: "proof did not verify".into(),
        }
        .into(),
        Heartbeat {
            sequence: 42,
            timestamp_ns: 1_700_000_000_000_000_000,
            ..Heartbeat::default()
        }
        .into(),
        Heartbeat {
            sequence: 43,
            timestamp_ns: 1_700_000_000_000_000_001,
            sent_conn_seq: Some(1_000),
            sent_streams: vec![StreamFinal {
                stream_id: 2,
                final_stream_seq: Some(400),
                final_record_count: 9_000,
            }],
            ..Default::default()
        }
        .into(),
        Report {
            consumed_conn_seq: u64::MAX,
            streams: vec![
                StreamReport {
                    stream_id: 1,
                    received: 100,
                    lost: 3,
                    late: 1,
                    duplicate: 2,
                    loss_fraction: 0.03,
                },
                StreamReport {
                    stream_id: u32::MAX,
                    ..StreamReport::default()
                },
            ],
            conn_received: 200,
            conn_lost: 3,
            conn_loss_fraction: 1.0,
            ..Default::default()
        }
        .into(),
        Goodbye {
            rc_final_conn_seq: None,
            final_conn_seq: Some(0),
            streams: vec![
                StreamFinal {
                    stream_id: 1,
                    final_stream_seq: Some(0),
                    final_record_count: 9,
                },
                StreamFinal {
                    stream_id: 2,
                    final_stream_seq: None,
                    final_record_count: 0,
                },
            ],
            reason: GoodbyeReason::Shutdown as i32,
            detail: String::new(),
        }
        .into(),
    ]
}

fn encode(msg: &ControlMessage) -> Vec<u8> {
    let mut out = Vec::new();
    if let Err(e) = encode_message(msg, &mut out) {
        panic!("encode {}: {e}", msg.name());
    }
    out
}

#[test]
fn every_message_round_trips() {
    let all = every_message();
    let names: Vec<&str> = all.iter().map(ControlMessage::name).collect();
    assert_eq!(
        names,
        [
            "Hello",
            "Hello",
            "Welcome",
            "Heartbeat",
            "Report",
            "Challenge",
            "Proof",
            "Welcome",
            "Refuse",
            "Heartbeat",
            "Heartbeat",
            "Report",
            "Goodbye"
        ]
    );
    for msg in &all {
        let bytes = encode(msg);
        let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        assert_eq!(len + LENGTH_PREFIX_BYTES, bytes.len(), "{}", msg.name());
        match decode_frame(&bytes) {
            Ok((back, used)) => {
                assert_eq!(&back, msg);
                assert_eq!(used, bytes.len());
            }
            Err(e) => panic!("decode {}: {e}", msg.name()),
        }
    }
}

#[test]
fn optional_zero_differs_from_absent() {
    // `final_stream_seq: Some(0)` (one frame sent) must survive as Some(0), not None.
    let msg = every_message().pop().unwrap_or_default();
    let bytes = encode(&msg);
    let Ok((
        ControlMessage {
            body: Some(Body::Goodbye(g)),
        },
        _,
    )) = decode_frame(&bytes)
    else {
        panic!("not a goodbye");
    };
    assert_eq!(g.final_conn_seq, Some(0));
    assert_eq!(g.streams[0].final_stream_seq, Some(0));
    assert_eq!(g.streams[1].final_stream_seq, None);
    assert_eq!(g.reason(), GoodbyeReason::Shutdown);
}

#[test]
fn stream_decoder_yields_messages_across_any_split() {
    let all = every_message();
    let mut wire = Vec::new();
    for m in &all {
        wire.extend(encode(m));
    }
    // Byte by byte through the internal buffer.
    let mut dec = ControlDecoder::new();
    let mut got = Vec::new();
    for b in &wire {
        dec.push(std::slice::from_ref(b));
        while let Some(m) = dec.next_message().unwrap_or_else(|e| panic!("{e}")) {
            got.push(m);
        }
    }
    assert_eq!(got, all);
    assert_eq!(dec.buffered(), 0);
    assert!(dec.finish().is_ok());

    // All at once through a caller-owned BytesMut.
    let mut src = BytesMut::from(&wire[..]);
    let mut dec = ControlDecoder::default();
    let mut got = Vec::new();
    while let Some(m) = dec.decode(&mut src).unwrap_or_else(|e| panic!("{e}")) {
        got.push(m);
    }
    assert_eq!(got, all);
    assert!(src.is_empty());
}

#[test]
fn truncated_input_is_reported() {
    let bytes = encode(&hello().into());
    for cut in 0..bytes.len() {
        let part = &bytes[..cut];
        match decode_frame(part) {
            Err(DecodeError::Truncated { needed, available }) => {
                assert_eq!(available, cut);
                let want = if cut < LENGTH_PREFIX_BYTES {
                    LENGTH_PREFIX_BYTES
                } else {
                    bytes.len()
                };
                assert_eq!(needed, want, "cut {cut}");
            }
            other => panic!("cut {cut}: {other:?}"),
        }
        let mut dec = ControlDecoder::new();
        dec.push(part);
        assert!(matches!(dec.next_message(), Ok(None)), "cut {cut}");
        if cut == 0 {
            assert!(dec.finish().is_ok());
        } else {
            assert!(matches!(dec.finish(), Err(DecodeError::Truncated { .. })));
        }
        let mut src = BytesMut::from(part);
        assert!(matches!(dec.decode(&mut src), Ok(None)));
        assert_eq!(src.len(), cut, "an incomplete frame is left in place");
    }
}

#[test]
fn oversized_input_is_refused_at_the_prefix() {
    let len = (MAX_CONTROL_MESSAGE_BYTES + 1) as u32;
    let prefix = len.to_be_bytes();
    assert!(matches!(
        decode_frame(&prefix),
        Err(DecodeError::TooLarge { len: l, max: MAX_CONTROL_MESSAGE_BYTES }) if l == len as usize
    ));
    let mut dec = ControlDecoder::new();
    dec.push(&u32::MAX.to_be_bytes());
    assert!(matches!(
        dec.next_message(),
        Err(DecodeError::TooLarge { .. })
    ));

    // A smaller configured limit.
    let bytes = encode(&welcome().into());
    let mut small = ControlDecoder::with_max_message_bytes(8);
    assert_eq!(small.max_message_bytes(), 8);
    small.push(&bytes);
    assert!(matches!(
        small.next_message(),
        Err(DecodeError::TooLarge { max: 8, .. })
    ));
    assert_eq!(
        ControlDecoder::with_max_message_bytes(usize::MAX).max_message_bytes(),
        MAX_CONTROL_MESSAGE_BYTES
    );

    // The encoder refuses too, and leaves the output untouched.
    let big = Refuse {
        reason: RefuseReason::Busy as i32,
        detail: String::new(),
    };
    let report = Report {
        streams: vec![
            StreamReport {
                stream_id: u32::MAX,
                received: u64::MAX,
                lost: u64::MAX,
                late: u64::MAX,
                duplicate: u64::MAX,
                loss_fraction: 0.5,
            };
            2000
        ],
        ..Report::default()
    };
    let mut out = vec![1, 2, 3];
    assert!(matches!(
        encode_message(&report.into(), &mut out),
        Err(EncodeError::TooLarge {
            name: "Report",
            max: MAX_CONTROL_MESSAGE_BYTES,
            ..
        })
    ));
    assert_eq!(out, [1, 2, 3]);
    assert!(encode_message(&big.into(), &mut out).is_ok());
}

#[test]
fn garbage_and_empty_bodies_are_errors() {
    // Length 0: decodes as an envelope without a body.
    assert!(matches!(
        decode_frame(&[0, 0, 0, 0]),
        Err(DecodeError::Invalid(e)) if e.field == "body"
    ));
    // Length 3 with a truncated varint field.
    assert!(matches!(
        decode_frame(&[0, 0, 0, 3, 0x0a, 0x05, 0x01]),
        Err(DecodeError::Protobuf { len: 3, .. })
    ));
    let mut out = Vec::new();
    assert!(matches!(
        encode_message(&ControlMessage::default(), &mut out),
        Err(EncodeError::Invalid { .. })
    ));
    assert!(out.is_empty());
}

/// Encode without validation, as a faulty or hostile peer would.
fn raw_frame(msg: &ControlMessage) -> Vec<u8> {
    use prost::Message as _;
    let body = msg.encode_to_vec();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

#[test]
fn validation_rejects_each_broken_rule() {
    let cases: Vec<(ControlMessage, &str, &str)> = vec![
        (
            Hello {
                protocol_version: 0,
                ..hello()
            }
            .into(),
            "Hello",
            "protocol_version",
        ),
        (
            Hello {
                agent_id: String::new(),
                ..hello()
            }
            .into(),
            "Hello",
            "agent_id",
        ),
        (
            Hello {
                agent_id: "a".repeat(129),
                ..hello()
            }
            .into(),
            "Hello",
            "agent_id",
        ),
        (
            Hello {
                hostname: "h".repeat(256),
                ..hello()
            }
            .into(),
            "Hello",
            "hostname",
        ),
        (
            Hello {
                transport: 0,
                ..hello()
            }
            .into(),
            "Hello",
            "transport",
        ),
        (
            Hello {
                transport: 9,
                ..hello()
            }
            .into(),
            "Hello",
            "transport",
        ),
        (
            Hello {
                capabilities: vec![],
                ..hello()
            }
            .into(),
            "Hello",
            "capabilities",
        ),
        (
            Hello {
                capabilities: vec![1, 7],
                ..hello()
            }
            .into(),
            "Hello",
            "capabilities",
        ),
        (
            Hello {
                qp: None,
                ..hello()
            }
            .into(),
            "Hello",
            "qp",
        ),
        (
            Hello {
                qp: Some(qp("")),
                ..hello()
            }
            .into(),
            "Hello",
            "qp.udp_addr",
        ),
        (
            Hello {
                transport: Transport::Verbs as i32,
                ..hello()
            }
            .into(),
            "Hello",
            "qp.udp_addr",
        ),
        (
            Hello {
                qp: Some(QpEndpoint {
                    gid: vec![0; 4],
                    ..qp("1.2.3.4:1")
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "qp.gid",
        ),
        (
            Hello {
                qp: Some(QpEndpoint {
                    qpn: 1 << 24,
                    ..qp("1.2.3.4:1")
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "qp.qpn",
        ),
        (
            Hello {
                qp: Some(QpEndpoint {
                    psn: 1 << 24,
                    ..qp("1.2.3.4:1")
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "qp.psn",
        ),
        (
            Hello {
                qp: Some(QpEndpoint {
                    mtu: 1500,
                    ..qp("1.2.3.4:1")
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "qp.mtu",
        ),
        (
            Hello {
                qp: Some(qp("host:99")),
                ..hello()
            }
            .into(),
            "Hello",
            "qp.udp_addr",
        ),
        (
            Challenge {
                nonce: vec![0; 31],
                collector_id: String::new(),
            }
            .into(),
            "Challenge",
            "nonce",
        ),
        (Proof { hmac: vec![0; 33] }.into(), "Proof", "hmac"),
        (
            Welcome {
                qp: None,
                ..welcome()
            }
            .into(),
            "Welcome",
            "qp",
        ),
        (
            Welcome {
                slots: 0,
                credit_window: 0,
                ..welcome()
            }
            .into(),
            "Welcome",
            "slots",
        ),
        (
            Welcome {
                max_frame_bytes: 63,
                ..welcome()
            }
            .into(),
            "Welcome",
            "max_frame_bytes",
        ),
        (
            Welcome {
                slot_bytes: 1000,
                ..welcome()
            }
            .into(),
            "Welcome",
            "slot_bytes",
        ),
        (
            Welcome {
                credit_window: 0,
                ..welcome()
            }
            .into(),
            "Welcome",
            "credit_window",
        ),
        (
            Welcome {
                credit_window: 1025,
                ..welcome()
            }
            .into(),
            "Welcome",
            "credit_window",
        ),
        (
            Welcome {
                heartbeat_interval_ms: 0,
                ..welcome()
            }
            .into(),
            "Welcome",
            "heartbeat_interval_ms",
        ),
        (
            Welcome {
                report_interval_ms: 0,
                ..welcome()
            }
            .into(),
            "Welcome",
            "report_interval_ms",
        ),
        (
            Welcome {
                data_path: 0,
                ..welcome()
            }
            .into(),
            "Welcome",
            "data_path",
        ),
        (
            Refuse {
                reason: 2,
                detail: "d".repeat(1025),
            }
            .into(),
            "Refuse",
            "detail",
        ),
        (
            Report {
                conn_loss_fraction: f64::NAN,
                ..Report::default()
            }
            .into(),
            "Report",
            "conn_loss_fraction",
        ),
        (
            Report {
                streams: vec![StreamReport {
                    loss_fraction: -0.1,
                    ..StreamReport::default()
                }],
                ..Report::default()
            }
            .into(),
            "Report",
            "streams.loss_fraction",
        ),
        (
            Goodbye {
                detail: "d".repeat(1025),
                ..Goodbye::default()
            }
            .into(),
            "Goodbye",
            "detail",
        ),
        (
            Hello {
                rc_lane: Some(RcLaneRequest {
                    qp: None,
                    stream_ids: vec![2],
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "rc_lane.qp",
        ),
        (
            Hello {
                rc_lane: Some(RcLaneRequest {
                    qp: Some(qp("")),
                    stream_ids: vec![2],
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "rc_lane.qp.udp_addr",
        ),
        (
            Hello {
                rc_lane: Some(RcLaneRequest {
                    qp: Some(QpEndpoint {
                        qpn: 1 << 24,
                        ..qp("10.0.0.7:4792")
                    }),
                    stream_ids: vec![2],
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "rc_lane.qp.qpn",
        ),
        (
            Hello {
                rc_lane: Some(RcLaneRequest {
                    qp: Some(qp("10.0.0.7:4792")),
                    stream_ids: vec![],
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "rc_lane.stream_ids",
        ),
        (
            Hello {
                rc_lane: Some(RcLaneRequest {
                    qp: Some(qp("10.0.0.7:4792")),
                    stream_ids: vec![2, 3, 2],
                }),
                ..hello()
            }
            .into(),
            "Hello",
            "rc_lane.stream_ids",
        ),
        (
            Welcome {
                rc_lane: Some(RcLane {
                    qp: None,
                    ..rc_welcome().rc_lane.unwrap_or_default()
                }),
                ..welcome()
            }
            .into(),
            "Welcome",
            "rc_lane.qp",
        ),
        (
            Welcome {
                rc_lane: Some(RcLane {
                    qp: Some(QpEndpoint {
                        mtu: 1500,
                        ..qp("[fe80::1]:4793")
                    }),
                    ..rc_welcome().rc_lane.unwrap_or_default()
                }),
                ..welcome()
            }
            .into(),
            "Welcome",
            "rc_lane.qp.mtu",
        ),
        (
            Welcome {
                rc_lane: Some(RcLane {
                    slots: 0,
                    credit_window: 0,
                    ..rc_welcome().rc_lane.unwrap_or_default()
                }),
                ..welcome()
            }
            .into(),
            "Welcome",
            "rc_lane.slots",
        ),
        (
            Welcome {
                rc_lane: Some(RcLane {
                    credit_window: 257,
                    ..rc_welcome().rc_lane.unwrap_or_default()
                }),
                ..welcome()
            }
            .into(),
            "Welcome",
            "rc_lane.credit_window",
        ),
        (
            Report {
                rc_lane: Some(LaneReport {
                    conn_loss_fraction: 1.5,
                    ..LaneReport::default()
                }),
                ..Report::default()
            }
            .into(),
            "Report",
            "rc_lane.conn_loss_fraction",
        ),
    ];
    for (msg, message, field) in cases {
        match msg.validate() {
            Err(e) => {
                assert_eq!((e.message, e.field), (message, field), "{e}");
                assert!(!e.problem.is_empty());
            }
            Ok(()) => panic!("{message}.{field} accepted: {msg:?}"),
        }
        // A peer that skips validation is caught by the decoder.
        assert!(matches!(
            decode_frame(&raw_frame(&msg)),
            Err(DecodeError::Invalid(_))
        ));
        let mut out = Vec::new();
        assert!(encode_message(&msg, &mut out).is_err());
    }
    // Verbs with an empty UDP address, and unknown refuse/goodbye reasons, are fine.
    let verbs = Hello {
        transport: Transport::Verbs as i32,
        qp: Some(qp("")),
        ..hello()
    };
    assert!(ControlMessage::from(verbs).validate().is_ok());
    let refuse = Refuse {
        reason: 99,
        detail: String::new(),
    };
    assert_eq!(refuse.reason(), RefuseReason::Unspecified);
    assert!(ControlMessage::from(refuse).validate().is_ok());
}

#[test]
fn accessors() {
    let q = qp("10.0.0.7:4791");
    assert_eq!(q.gid_array().map(|g| g[15]), Some(7));
    assert_eq!(q.udp_socket_addr().map(|a| a.port()), Some(4791));
    assert_eq!(QpEndpoint { gid: vec![1], ..q }.gid_array(), None);
    let c = Challenge {
        nonce: vec![9; 32],
        collector_id: String::new(),
    };
    assert_eq!(c.nonce_array(), Some([9; 32]));
    assert_eq!(hello().transport(), Transport::Soft);
    assert_eq!(welcome().data_path(), DataPath::WriteWithImm);
}

#[test]
fn proof_matches_the_documented_transcript() {
    // Known answer computed independently from the documented transcript:
    // HMAC-SHA256(token, "uctel-control-v1/proof" || 0x00 || nonce || u32be(8) || "agent-01"
    //             || u64be(0x0123456789abcdef)).
    let nonce: [u8; 32] = std::array::from_fn(|i| i as u8);
    let p = proof(
        b"correct horse battery staple",
        &nonce,
        "agent-01",
        0x0123_4567_89ab_cdef,
    );
    let hex: String = p.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "f0efcf2bf96b447bbad267a30df2dc115ee34874c44064f832583796c32eaf61"
    );
}

#[test]
fn verify_accepts_the_right_token_and_rejects_everything_else() {
    let token = b"s3cret-token";
    let nonce = [7u8; NONCE_BYTES];
    let p = proof(token, &nonce, "agent-01", 5);
    assert!(verify_proof(token, &nonce, "agent-01", 5, &p));
    assert!(
        !verify_proof(b"s3cret-tokeN", &nonce, "agent-01", 5, &p),
        "wrong token"
    );
    let mut other_nonce = nonce;
    other_nonce[31] ^= 1;
    assert!(
        !verify_proof(token, &other_nonce, "agent-01", 5, &p),
        "wrong nonce"
    );
    assert!(
        !verify_proof(token, &nonce, "agent-02", 5, &p),
        "wrong agent"
    );
    assert!(
        !verify_proof(token, &nonce, "agent-01", 6, &p),
        "wrong epoch"
    );
    assert!(
        !verify_proof(token, &nonce, "agent-01", 5, &p[..31]),
        "truncated proof"
    );
    assert!(
        !verify_proof(token, &nonce, "agent-01", 5, &[]),
        "empty proof"
    );
    let mut flipped = p;
    flipped[0] ^= 0x80;
    assert!(
        !verify_proof(token, &nonce, "agent-01", 5, &flipped),
        "altered proof"
    );
    // Empty and long tokens are plain HMAC keys too.
    let long = [0xabu8; 200];
    assert!(verify_proof(
        &long,
        &nonce,
        "a",
        0,
        &proof(&long, &nonce, "a", 0)
    ));
    assert!(!verify_proof(
        &long[..199],
        &nonce,
        "a",
        0,
        &proof(&long, &nonce, "a", 0)
    ));
    assert!(verify_proof(
        b"",
        &nonce,
        "a",
        0,
        &proof(b"", &nonce, "a", 0)
    ));
}

#[test]
fn nonces_are_fresh() {
    let a = random_nonce().unwrap_or_else(|e| panic!("{e}"));
    let b = random_nonce().unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(a, b);
    assert_ne!(a, [0; NONCE_BYTES]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any byte string fed in any chunking never panics, and yields messages or an error.
    #[test]
    fn arbitrary_bytes_never_panic(
        data in prop::collection::vec(any::<u8>(), 0..512),
        chunk in 1usize..64,
    ) {
        let mut dec = ControlDecoder::new();
        'outer: for c in data.chunks(chunk) {
            dec.push(c);
            loop {
                match dec.next_message() {
                    Ok(Some(m)) => prop_assert!(m.validate().is_ok()),
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
        }
        let _ = decode_frame(&data);
    }

    /// A valid stream split at arbitrary points decodes to the same messages.
    #[test]
    fn valid_stream_any_chunking(
        picks in prop::collection::vec(0usize..8, 1..20),
        chunk in 1usize..200,
        epoch in any::<u64>(),
        seq in any::<u64>(),
    ) {
        let all = every_message();
        let msgs: Vec<ControlMessage> = picks
            .iter()
            .map(|&i| match all[i].body.clone() {
                Some(Body::Hello(h)) => Hello { epoch, ..h }.into(),
                Some(Body::Heartbeat(_)) => Heartbeat { sequence: seq, timestamp_ns: seq, ..Heartbeat::default() }.into(),
                _ => all[i].clone(),
            })
            .collect();
        let mut wire = Vec::new();
        for m in &msgs {
            prop_assert!(encode_message(m, &mut wire).is_ok());
        }
        let mut dec = ControlDecoder::new();
        let mut got = Vec::new();
        for c in wire.chunks(chunk) {
            dec.push(c);
            while let Some(m) = dec.next_message().map_err(|e| TestCaseError::fail(e.to_string()))? {
                got.push(m);
            }
        }
        prop_assert_eq!(got, msgs);
        prop_assert!(dec.finish().is_ok());
    }
}
