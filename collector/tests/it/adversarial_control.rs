//! Adversarial tests of the control plane: whatever a peer sends on the TCP control port, the
//! collector answers with a counted refusal or a closed connection, keeps serving everyone
//! else and never hangs or panics.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::{collector_config, eventually, sample, AgentOptions, MetricStream, TestAgent, TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uctel_common::control::ControlChannel;
use uctel_protocol::control::{
    self as wire, Body, ControlMessage, DataPath, Goodbye, GoodbyeReason, Heartbeat, Hello, Proof,
    QpEndpoint, RefuseReason, Report, StreamFinal, Transport, Welcome,
};
use uctel_protocol::frame::{build_frame, FrameHeader, FrameKind};

/// Bound on every read in these tests.
const READ_BOUND: Duration = Duration::from_secs(20);

fn hello(agent_id: &str, epoch: u64) -> Hello {
    Hello {
        protocol_version: wire::PROTOCOL_VERSION,
        agent_id: agent_id.into(),
        hostname: format!("{agent_id}.test"),
        epoch,
        transport: Transport::Soft as i32,
        capabilities: vec![DataPath::WriteWithImm as i32, DataPath::Send as i32],
        qp: Some(QpEndpoint {
            gid: vec![0; 16],
            qpn: 0x11,
            psn: 1,
            mtu: 4096,
            udp_addr: "127.0.0.1:9".into(),
        }),
        ..Default::default()
    }
}

fn refused(text: &str, reason: RefuseReason) -> f64 {
    sample(
        text,
        &format!(
            "uctel_collector_handshakes_refused_total{{reason=\"{}\"}}",
            reason.label()
        ),
    )
    .unwrap_or(0.0)
}

async fn wait_refused(running: &uctel_collector::Running, reason: RefuseReason, n: f64) {
    eventually(&format!("{n} refusals of {}", reason.label()), || {
        let text = running.render_metrics().ok()?;
        (refused(&text, reason) >= n).then_some(())
    })
    .await;
}

/// Everything the collector sends until it closes: the messages, decoded with the real
/// decoder (a decode error ends the list).
async fn read_until_closed(stream: &mut TcpStream) -> Vec<ControlMessage> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(READ_BOUND, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => bytes.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("the collector kept the connection open for {READ_BOUND:?}"),
        }
    }
    let mut out = Vec::new();
    let mut rest = &bytes[..];
    while let Ok((m, used)) = wire::decode_frame(rest) {
        out.push(m);
        rest = &rest[used..];
    }
    out
}

fn refuse_reason(msgs: &[ControlMessage]) -> Option<RefuseReason> {
    msgs.iter().find_map(|m| match &m.body {
        Some(Body::Refuse(r)) => RefuseReason::try_from(r.reason).ok(),
        _ => None,
    })
}

/// Writes `bytes` raw, optionally half-closes, and returns the collector's refusal reason.
async fn raw_exchange(addr: SocketAddr, bytes: &[u8], half_close: bool) -> Option<RefuseReason> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if half_close {
        s.shutdown().await.unwrap();
    }
    refuse_reason(&read_until_closed(&mut s).await)
}

/// A Hello, then the collector's answer to it (Challenge or Refuse).
async fn send_hello(addr: SocketAddr, h: Hello) -> (ControlChannel<TcpStream>, Option<Body>) {
    let mut ch = ControlChannel::new(TcpStream::connect(addr).await.unwrap());
    ch.send(h).await.unwrap();
    let answer = tokio::time::timeout(READ_BOUND, ch.recv())
        .await
        .expect("an answer to Hello")
        .ok()
        .flatten()
        .and_then(|m| m.body);
    (ch, answer)
}

/// A Hello whose encoding bypasses our own validation (the encoder refuses invalid
/// messages), framed by hand.
fn framed_unchecked(msg: &ControlMessage) -> Vec<u8> {
    use prost::Message as _;
    let body = msg.encode_to_vec();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// A fake agent that completes the handshake with the right token (its QP endpoint is a
/// placeholder: control-plane tests send no frames).
async fn authenticated(addr: SocketAddr, agent_id: &str, epoch: u64) -> ControlChannel<TcpStream> {
    let mut ch = ControlChannel::new(TcpStream::connect(addr).await.unwrap());
    uctel_common::control::client_handshake(&mut ch, hello(agent_id, epoch), TOKEN.as_bytes())
        .await
        .expect("handshake");
    ch
}

/// The next message other than a Heartbeat or a Report; `None` once the collector closed.
async fn next_notable(ch: &mut ControlChannel<TcpStream>) -> Option<Body> {
    loop {
        match tokio::time::timeout(READ_BOUND, ch.recv()).await {
            Ok(Ok(Some(m))) => match m.body {
                Some(Body::Heartbeat(_)) | Some(Body::Report(_)) => {}
                other => return other,
            },
            Ok(Ok(None)) | Ok(Err(_)) => return None,
            Err(_) => panic!("nothing from the collector for {READ_BOUND:?}"),
        }
    }
}

async fn agents_connected(running: &uctel_collector::Running, n: f64) {
    eventually(&format!("{n} agents connected"), || {
        let text = running.render_metrics().ok()?;
        (sample(&text, "uctel_collector_agents_connected") == Some(n)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_lying_length_prefixes_are_refused_as_protocol_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    // A refusal that waited for this timeout would fail the read bound above.
    config.control.handshake_timeout_seconds = 600.0;
    let running = uctel_collector::start(config).await.unwrap();
    let addr = running.control_addr();
    // Not protobuf at all behind a plausible prefix.
    let mut garbage = 40u32.to_be_bytes().to_vec();
    garbage.extend((0..40u8).map(|i| i.wrapping_mul(97) | 0x80));
    assert_eq!(
        raw_exchange(addr, &garbage, false).await,
        Some(RefuseReason::ProtocolError)
    );
    // A prefix announcing 4 GiB: refused as soon as the prefix is in, nothing buffered.
    assert_eq!(
        raw_exchange(addr, &[0xff; 4], false).await,
        Some(RefuseReason::ProtocolError)
    );
    // One byte above the 64 KiB limit.
    let over = (wire::MAX_CONTROL_MESSAGE_BYTES as u32 + 1).to_be_bytes();
    assert_eq!(
        raw_exchange(addr, &over, false).await,
        Some(RefuseReason::ProtocolError)
    );
    // Half a prefix, then end of stream.
    assert_eq!(
        raw_exchange(addr, &[0, 0], true).await,
        Some(RefuseReason::ProtocolError)
    );
    // A prefix promising 100 bytes, 10 delivered, then end of stream.
    let mut short = 100u32.to_be_bytes().to_vec();
    short.extend([0u8; 10]);
    assert_eq!(
        raw_exchange(addr, &short, true).await,
        Some(RefuseReason::ProtocolError)
    );
    // A zero-length message is an empty envelope: no body.
    assert_eq!(
        raw_exchange(addr, &[0, 0, 0, 0], false).await,
        Some(RefuseReason::ProtocolError)
    );
    // Connect and close at once: a pool member's health probe, closed without an answer and
    // counted as a probe, not as a refused handshake.
    assert_eq!(raw_exchange(addr, &[], true).await, None);
    wait_refused(&running, RefuseReason::ProtocolError, 6.0).await;
    let text = running.render_metrics().unwrap();
    assert!(
        text.contains("uctel_collector_control_probes_total 1"),
        "{text}"
    );
    // The daemon still serves a well-behaved agent.
    let agent = TestAgent::connect(addr, AgentOptions::new("good"))
        .await
        .unwrap();
    agent.goodbye(Vec::new()).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_hello_fields_are_refused_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    let with_qp = |f: &dyn Fn(&mut QpEndpoint)| {
        let mut h = hello("absurd", 1);
        if let Some(qp) = h.qp.as_mut() {
            f(qp);
        }
        h
    };
    let cases: Vec<(&str, Hello, RefuseReason)> = vec![
        (
            "agent id of 129 bytes",
            hello(&"a".repeat(wire::MAX_ID_BYTES + 1), 1),
            RefuseReason::ProtocolError,
        ),
        ("empty agent id", hello("", 1), RefuseReason::ProtocolError),
        (
            "hostname of 60 KiB",
            Hello {
                hostname: "h".repeat(60 * 1024),
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "QPN above 24 bits",
            with_qp(&|qp| qp.qpn = 1 << 24),
            RefuseReason::ProtocolError,
        ),
        (
            "PSN above 24 bits",
            with_qp(&|qp| qp.psn = u32::MAX),
            RefuseReason::ProtocolError,
        ),
        (
            "MTU 1500",
            with_qp(&|qp| qp.mtu = 1500),
            RefuseReason::ProtocolError,
        ),
        (
            "GID of 15 bytes",
            with_qp(&|qp| qp.gid = vec![0; 15]),
            RefuseReason::ProtocolError,
        ),
        (
            "udp_addr not ip:port",
            with_qp(&|qp| qp.udp_addr = "collector.example:4791".into()),
            RefuseReason::ProtocolError,
        ),
        (
            // The refusal detail quotes the address: cut at 1024 bytes it must not split a
            // character.
            "udp_addr of 1000 two-byte characters",
            with_qp(&|qp| qp.udp_addr = "é".repeat(1000)),
            RefuseReason::ProtocolError,
        ),
        (
            "udp_addr of 1000 three-byte characters",
            with_qp(&|qp| qp.udp_addr = "€".repeat(1000)),
            RefuseReason::ProtocolError,
        ),
        (
            "soft transport without udp_addr",
            with_qp(&|qp| qp.udp_addr.clear()),
            RefuseReason::ProtocolError,
        ),
        (
            "no QP",
            Hello {
                qp: None,
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "version 0",
            Hello {
                protocol_version: 0,
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "version from the future",
            Hello {
                protocol_version: u32::MAX,
                ..hello("absurd", 1)
            },
            RefuseReason::VersionMismatch,
        ),
        (
            "unknown transport",
            Hello {
                transport: 77,
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "verbs transport at a soft collector",
            Hello {
                transport: Transport::Verbs as i32,
                qp: Some(QpEndpoint {
                    udp_addr: String::new(),
                    ..hello("absurd", 1).qp.unwrap()
                }),
                ..hello("absurd", 1)
            },
            RefuseReason::TransportMismatch,
        ),
        (
            "no data path",
            Hello {
                capabilities: vec![],
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "unknown data path",
            Hello {
                capabilities: vec![1, 99],
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "RC lane without a QP",
            Hello {
                rc_lane: Some(wire::RcLaneRequest {
                    qp: None,
                    stream_ids: vec![2],
                }),
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "RC lane without a stream",
            Hello {
                rc_lane: Some(wire::RcLaneRequest {
                    qp: hello("absurd", 1).qp,
                    stream_ids: vec![],
                }),
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "RC lane naming a stream twice",
            Hello {
                rc_lane: Some(wire::RcLaneRequest {
                    qp: hello("absurd", 1).qp,
                    stream_ids: vec![2, 2],
                }),
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "RC lane QP with an MTU of 1500",
            Hello {
                rc_lane: Some(wire::RcLaneRequest {
                    qp: hello("absurd", 1)
                        .qp
                        .map(|qp| QpEndpoint { mtu: 1500, ..qp }),
                    stream_ids: vec![2],
                }),
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
        (
            "RC lane of 65 streams",
            Hello {
                rc_lane: Some(wire::RcLaneRequest {
                    qp: hello("absurd", 1).qp,
                    stream_ids: (0..65).collect(),
                }),
                ..hello("absurd", 1)
            },
            RefuseReason::ProtocolError,
        ),
    ];
    let mut expected = std::collections::HashMap::<RefuseReason, f64>::new();
    for (what, h, want) in cases {
        let bytes = framed_unchecked(&h.into());
        let got = raw_exchange(addr, &bytes, false).await;
        assert_eq!(got, Some(want), "{what}");
        *expected.entry(want).or_default() += 1.0;
    }
    for (reason, n) in expected {
        wait_refused(&running, reason, n).await;
    }
    // An IPv6 UDP address at an IPv4 collector is a valid Hello: the agent is served (its
    // frames could never arrive, which the sequence tracker would show) and leaves cleanly.
    let (mut ch, answer) = send_hello(addr, with_qp(&|qp| qp.udp_addr = "[::1]:4791".into())).await;
    let Some(Body::Challenge(c)) = answer else {
        panic!("IPv6 endpoint: {answer:?}")
    };
    let nonce = c.nonce_array().unwrap();
    ch.send(Proof {
        hmac: wire::proof(TOKEN.as_bytes(), &nonce, "absurd", 1).to_vec(),
    })
    .await
    .unwrap();
    let welcome = next_notable(&mut ch).await;
    assert!(matches!(welcome, Some(Body::Welcome(_))), "{welcome:?}");
    agents_connected(&running, 1.0).await;
    ch.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_trickling_handshakes_time_out_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.control.handshake_timeout_seconds = 0.5;
    let running = uctel_collector::start(config).await.unwrap();
    let addr = running.control_addr();
    // Idle connections that never say a word.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    // A slowloris: a valid prefix, then one byte every 50 ms.
    let trickle = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&1000u32.to_be_bytes()).await;
        for _ in 0..400 {
            if s.write_all(&[0x0a]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    });
    // A Hello and then silence instead of the Proof.
    let (mut silent, answer) = send_hello(addr, hello("silent", 3)).await;
    assert!(matches!(answer, Some(Body::Challenge(_))), "{answer:?}");
    for s in &mut idle {
        let msgs = read_until_closed(s).await;
        assert_eq!(
            refuse_reason(&msgs),
            Some(RefuseReason::HandshakeTimeout),
            "{msgs:?}"
        );
    }
    assert!(
        matches!(next_notable(&mut silent).await, Some(Body::Refuse(r)) if r.reason == RefuseReason::HandshakeTimeout as i32)
    );
    assert!(
        trickle.await.unwrap(),
        "the trickling connection was never closed"
    );
    wait_refused(&running, RefuseReason::HandshakeTimeout, 42.0).await;
    let agent = TestAgent::connect(addr, AgentOptions::new("after-slowloris"))
        .await
        .unwrap();
    agent.goodbye(Vec::new()).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_proof_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    // A legitimate handshake, observed on the wire.
    let (mut ch, answer) = send_hello(addr, hello("victim", 42)).await;
    let Some(Body::Challenge(c)) = answer else {
        panic!("{answer:?}")
    };
    let captured = wire::proof(TOKEN.as_bytes(), &c.nonce_array().unwrap(), "victim", 42);
    ch.send(Proof {
        hmac: captured.to_vec(),
    })
    .await
    .unwrap();
    assert!(matches!(
        next_notable(&mut ch).await,
        Some(Body::Welcome(_))
    ));
    // The attacker replays Hello and the captured Proof on a new connection: the nonce differs.
    let (mut replay, answer) = send_hello(addr, hello("victim", 42)).await;
    let Some(Body::Challenge(c2)) = answer else {
        panic!("{answer:?}")
    };
    assert_ne!(c.nonce, c2.nonce, "nonces repeat");
    replay
        .send(Proof {
            hmac: captured.to_vec(),
        })
        .await
        .unwrap();
    let answer = next_notable(&mut replay).await;
    assert!(
        matches!(&answer, Some(Body::Refuse(r)) if r.reason == RefuseReason::BadProof as i32),
        "{answer:?}"
    );
    wait_refused(&running, RefuseReason::BadProof, 1.0).await;
    // The replay did not disturb the legitimate session.
    ch.send(Heartbeat::default()).await.unwrap();
    agents_connected(&running, 1.0).await;
    ch.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_connection_with_the_same_id_is_refused_and_a_silent_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.control.heartbeat_interval_seconds = 1.0;
    let running = uctel_collector::start(config).await.unwrap();
    let addr = running.control_addr();
    let mut first = authenticated(addr, "twin", 1).await;
    agents_connected(&running, 1.0).await;
    first.send(Heartbeat::default()).await.unwrap();
    // The first is alive: the second is kept out, the first keeps its session.
    let mut ch = ControlChannel::new(TcpStream::connect(addr).await.unwrap());
    match uctel_common::control::client_handshake(&mut ch, hello("twin", 2), TOKEN.as_bytes()).await
    {
        Err(uctel_common::control::HandshakeError::Refused { reason, .. }) => {
            assert_eq!(reason, RefuseReason::DuplicateAgentId);
        }
        other => panic!("second live connection: {other:?}"),
    }
    agents_connected(&running, 1.0).await;
    // The first goes silent for more than 1.5 heartbeat intervals: a newer connection of
    // the id (an agent restart racing its old connection) replaces it.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let mut second = authenticated(addr, "twin", 3).await;
    match next_notable(&mut first).await {
        Some(Body::Goodbye(g)) => assert_eq!(g.reason, GoodbyeReason::Reconnect as i32, "{g:?}"),
        other => panic!("first connection: {other:?}"),
    }
    assert!(next_notable(&mut first).await.is_none(), "first stays open");
    agents_connected(&running, 1.0).await;
    // The survivor is fully served.
    second.send(Heartbeat::default()).await.unwrap();
    let report = tokio::time::timeout(READ_BOUND, async {
        loop {
            if let Ok(Some(ControlMessage {
                body: Some(Body::Report(r)),
            })) = second.recv().await
            {
                return r;
            }
        }
    })
    .await
    .expect("reports keep coming");
    assert_eq!(report.conn_received, 0);
    second.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_messages_from_an_agent_end_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    // During the handshake: anything but Hello first, anything but Proof second.
    let welcome = Welcome {
        qp: hello("x", 1).qp,
        ring_addr: 0,
        rkey: 1,
        slots: 1,
        slot_bytes: 4096,
        max_frame_bytes: 4096,
        credit_window: 1,
        heartbeat_interval_ms: 1,
        report_interval_ms: 1,
        data_path: DataPath::Send as i32,
        ..Default::default()
    };
    let mut framed = Vec::new();
    wire::encode_message(&welcome.clone().into(), &mut framed).unwrap();
    assert_eq!(
        raw_exchange(addr, &framed, false).await,
        Some(RefuseReason::ProtocolError)
    );
    let mut framed = Vec::new();
    wire::encode_message(&Proof { hmac: vec![0; 32] }.into(), &mut framed).unwrap();
    assert_eq!(
        raw_exchange(addr, &framed, false).await,
        Some(RefuseReason::ProtocolError)
    );
    let (mut ch, _) = send_hello(addr, hello("x", 1)).await;
    ch.send(hello("x", 1)).await.unwrap();
    assert!(
        matches!(next_notable(&mut ch).await, Some(Body::Refuse(r)) if r.reason == RefuseReason::ProtocolError as i32)
    );
    wait_refused(&running, RefuseReason::ProtocolError, 3.0).await;
    // After the handshake: Report, Welcome, Hello from the agent end the session with
    // Goodbye(error), and the agent can come back.
    let bodies: Vec<ControlMessage> = vec![
        Report::default().into(),
        welcome.into(),
        hello("x", 1).into(),
    ];
    for (i, body) in bodies.into_iter().enumerate() {
        let mut ch = authenticated(addr, "x", 10 + i as u64).await;
        ch.send(body).await.unwrap();
        match next_notable(&mut ch).await {
            Some(Body::Goodbye(g)) => assert_eq!(g.reason, GoodbyeReason::Error as i32),
            other => panic!("{other:?}"),
        }
        assert!(next_notable(&mut ch).await.is_none());
        agents_connected(&running, 0.0).await;
    }
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_flood_is_absorbed() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    let mut ch = authenticated(addr, "chatty", 5).await;
    for i in 0..20_000u64 {
        ch.send(Heartbeat {
            sequence: i,
            timestamp_ns: u64::MAX - i,
            ..Heartbeat::default()
        })
        .await
        .unwrap();
        if i % 512 == 0 {
            // Drain what the collector sent meanwhile so neither side blocks on a full socket.
            while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::ZERO, ch.recv()).await {}
        }
    }
    agents_connected(&running, 1.0).await;
    // Reports still come.
    let got_report = tokio::time::timeout(READ_BOUND, async {
        loop {
            if let Ok(Some(ControlMessage {
                body: Some(Body::Report(_)),
            })) = ch.recv().await
            {
                return;
            }
        }
    })
    .await;
    assert!(got_report.is_ok(), "no Report after the flood");
    ch.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    running.stop().await.unwrap();
}

/// An agent's `Goodbye` that lies about its final sequences must not push the loss counters
/// by more than the configured maximum dropout (the rule the tracker applies to any jump),
/// and a counter must never wrap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_goodbye_sequences_do_not_poison_loss_counters() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    let lost = |text: &str, stream: u32| {
        sample(
            text,
            &format!("uctel_collector_frames_lost_total{{agent=\"liar\",stream=\"{stream}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let records_lost = |text: &str, stream: u32| {
        sample(
            text,
            &format!("uctel_collector_records_lost_total{{agent=\"liar\",stream=\"{stream}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let conn_lost = |text: &str| {
        sample(
            text,
            "uctel_collector_connection_frames_lost_total{agent=\"liar\"}",
        )
        .unwrap_or(0.0)
    };
    // Stream ids 11 and 12: their `stream` label is the number.
    // 1. Ten frames on stream 11, then a Goodbye claiming fewer (smaller than received) and,
    //    for stream 12 (never seen), u64::MAX.
    let mut agent = TestAgent::connect(addr, AgentOptions::new("liar"))
        .await
        .unwrap();
    let mut metrics = MetricStream::new(11);
    for step in 0..10 {
        agent.send(metrics.frame(step, 1)).await;
    }
    agent.flush().await;
    eventually("ten frames in", || {
        let text = running.render_metrics().ok()?;
        (sample(
            &text,
            "uctel_collector_frames_received_total{agent=\"liar\",stream=\"11\"}",
        ) == Some(10.0))
        .then_some(())
    })
    .await;
    agent
        .goodbye(vec![
            StreamFinal {
                stream_id: 11,
                final_stream_seq: Some(3),
                final_record_count: 4,
            },
            StreamFinal {
                stream_id: 12,
                final_stream_seq: Some(u64::MAX),
                final_record_count: u64::MAX,
            },
        ])
        .await;
    let text = running.render_metrics().unwrap();
    assert_eq!(lost(&text, 11), 0.0, "{text}");
    assert!(
        lost(&text, 12) <= 3001.0,
        "stream 12 lost {}",
        lost(&text, 12)
    );
    assert!(
        records_lost(&text, 12) <= 3001.0 * 1024.0,
        "stream 12 records lost {}",
        records_lost(&text, 12)
    );
    // 2. No frames at all, final_conn_seq u64::MAX and a stream 2^62 frames ahead of what
    //    arrived.
    let mut ch = authenticated(addr, "liar", 77).await;
    ch.send(Goodbye {
        rc_final_conn_seq: None,
        final_conn_seq: Some(u64::MAX),
        streams: vec![StreamFinal {
            stream_id: 11,
            final_stream_seq: Some(u64::MAX - 1),
            final_record_count: u64::MAX,
        }],
        reason: GoodbyeReason::Shutdown as i32,
        detail: String::new(),
    })
    .await
    .unwrap();
    assert!(next_notable(&mut ch).await.is_none());
    let mut agent = TestAgent::connect(addr, AgentOptions::new("liar"))
        .await
        .unwrap();
    let mut metrics = MetricStream::new(11);
    agent.send(metrics.frame(0, 1)).await;
    agent.flush().await;
    agent
        .goodbye(vec![StreamFinal {
            stream_id: 11,
            final_stream_seq: Some(1 << 62),
            final_record_count: 1 << 62,
        }])
        .await;
    let before = running.render_metrics().unwrap();
    // 3. A last, honest connection with one lost frame: every counter only moves up.
    let mut agent = TestAgent::connect(addr, AgentOptions::new("liar"))
        .await
        .unwrap();
    let mut metrics = MetricStream::new(11);
    agent.send(metrics.frame(0, 1)).await;
    let _skipped = metrics.frame(1, 1);
    agent.send(metrics.frame(2, 1)).await;
    agent.goodbye(vec![metrics.final_state()]).await;
    let after = running.render_metrics().unwrap();
    for (what, b, a) in [
        ("frames_lost", lost(&before, 11), lost(&after, 11)),
        (
            "records_lost",
            records_lost(&before, 11),
            records_lost(&after, 11),
        ),
        (
            "connection_frames_lost",
            conn_lost(&before),
            conn_lost(&after),
        ),
    ] {
        assert!(a >= b, "{what} went down: {b} -> {a}");
        assert!(a < 1e9, "{what} = {a}: a lying Goodbye was counted as loss");
    }
    assert_eq!(lost(&after, 11) - lost(&before, 11), 1.0);
    running.stop().await.unwrap();
}

/// The per-connection stream limit keeps every `Report` under the 64 KiB control message
/// limit, so an agent with very many lossy streams is not disconnected at every report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_lossy_streams_keep_reports_within_the_message_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    // Room for every frame in the ring, and all of them inside one report interval.
    config.ring.slots = 8192;
    config.ring.descriptor_queue = 16384;
    config.control.report_interval_seconds = 0.5;
    let running = uctel_collector::start(config).await.unwrap();
    let mut opts = AgentOptions::new("wide");
    opts.capabilities = vec![DataPath::WriteWithImm];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    // Two frames per stream, stream_seq 0 and 3000 (a gap of 2999 frames, inside the maximum
    // dropout): every StreamReport carries large counters and a loss fraction.
    let streams = 4000u32;
    running.pause_worker(true);
    for (i, s) in (0..streams).chain(0..streams).enumerate() {
        let stream_seq = if i < streams as usize { 0 } else { 3000 };
        let header = FrameHeader {
            epoch: agent.epoch,
            conn_seq: i as u64,
            stream_seq,
            record_count: stream_seq + 1,
            ..FrameHeader::new(FrameKind::Heartbeat, 1000 + s)
        };
        agent.post_raw(i as u64, &build_frame(&header, &[]).unwrap());
        if i % 64 == 63 {
            agent.flush().await;
        }
    }
    agent.advance_conn_seq(2 * u64::from(streams));
    agent.flush().await;
    eventually("every frame completed at the collector", || {
        let text = running.render_metrics().map_err(|e| e.to_string())?;
        let waiting = sample(&text, "uctel_collector_ring_slots_in_use{agent=\"wide\"}");
        if waiting.is_some_and(|w| w >= 2.0 * f64::from(streams)) {
            return Ok(());
        }
        // What a timeout needs to be understood: how far it got and what was dropped.
        let drops: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("uctel_collector_") && l.contains("dropped"))
            .collect();
        Err(format!("{waiting:?} of {} waiting; {drops:?}", 2 * streams))
    })
    .await;
    running.pause_worker(false);
    // Reports keep coming and the connection stays up.
    for _ in 0..5 {
        agent.wait_report().await;
    }
    let text = running.render_metrics().unwrap();
    assert_eq!(sample(&text, "uctel_collector_agents_connected"), Some(1.0));
    let tracked = text
        .lines()
        .filter(|l| {
            l.starts_with("uctel_collector_frames_received_total{agent=\"wide\"")
                && !l.ends_with(" 0")
        })
        .count() as u64;
    let limited = sample(
        &text,
        "uctel_collector_frames_dropped_total{agent=\"wide\",reason=\"limit_exceeded\"}",
    )
    .unwrap_or(0.0) as u64;
    // Every frame is accounted: two per tracked stream, the rest over the stream limit.
    assert_eq!(
        2 * tracked + limited,
        2 * u64::from(streams),
        "{tracked} + {limited}"
    );
    agent.goodbye(Vec::new()).await;
    running.stop().await.unwrap();
}

/// An agent that keeps sending heartbeats but never reads its control connection: once the
/// collector's writes cannot go out, the collector ends the session instead of waiting on
/// the write forever (which would also stall its shutdown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_that_stops_reading_is_disconnected_and_shutdown_completes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.ring.slots = 4096;
    config.ring.descriptor_queue = 8192;
    config.control.heartbeat_interval_seconds = 0.2;
    config.control.report_interval_seconds = 0.01;
    let running = uctel_collector::start(config).await.unwrap();
    let mut opts = AgentOptions::new("deaf");
    opts.capabilities = vec![DataPath::WriteWithImm];
    let mut agent = TestAgent::connect(running.control_addr(), opts)
        .await
        .unwrap();
    // Many streams make every Report tens of kilobytes, so the socket buffers fill quickly.
    let streams = 1000u32;
    for (i, s) in (0..streams).chain(0..streams).enumerate() {
        let stream_seq = if i < streams as usize { 0 } else { 100 };
        let header = FrameHeader {
            epoch: agent.epoch,
            conn_seq: i as u64,
            stream_seq,
            record_count: stream_seq + 1,
            ..FrameHeader::new(FrameKind::Heartbeat, 1000 + s)
        };
        agent.post_raw(i as u64, &build_frame(&header, &[]).unwrap());
        if i % 64 == 63 {
            agent.flush().await;
        }
    }
    agent.flush().await;
    let start = std::time::Instant::now();
    let mut disconnected = false;
    let mut writing = true;
    while start.elapsed() < Duration::from_secs(20) {
        // Keep the session alive with heartbeats until the collector gives up on it.
        writing = writing && agent.heartbeat_without_reading().await;
        let text = running.render_metrics().unwrap();
        if sample(&text, "uctel_collector_agents_connected") == Some(0.0) {
            disconnected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        disconnected,
        "the collector still holds the session of an agent that stopped reading"
    );
    tokio::time::timeout(Duration::from_secs(30), running.stop())
        .await
        .expect("shutdown completes")
        .unwrap();
    drop(agent);
}

/// More idle connections than the collector keeps in the handshake at once: the excess is
/// refused at once as `busy` (so silent peers cannot exhaust file descriptors), the rest time
/// out, and a well-behaved agent gets in afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_handshakes_are_bounded() {
    use uctel_collector::control::MAX_PENDING_HANDSHAKES;
    let dir = tempfile::tempdir().unwrap();
    let mut config = collector_config(dir.path());
    config.control.handshake_timeout_seconds = 2.0;
    let running = uctel_collector::start(config).await.unwrap();
    let addr = running.control_addr();
    let extra = 40;
    let mut idle = Vec::new();
    for _ in 0..MAX_PENDING_HANDSHAKES + extra {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut busy = 0;
    let mut timed_out = 0;
    for s in &mut idle {
        match refuse_reason(&read_until_closed(s).await) {
            Some(RefuseReason::Busy) => busy += 1,
            Some(RefuseReason::HandshakeTimeout) => timed_out += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((busy, timed_out), (extra, MAX_PENDING_HANDSHAKES));
    wait_refused(&running, RefuseReason::Busy, extra as f64).await;
    let agent = TestAgent::connect(addr, AgentOptions::new("patient"))
        .await
        .unwrap();
    agent.goodbye(Vec::new()).await;
    running.stop().await.unwrap();
}

/// `Heartbeat.agent_counters` with `records` no_credit drops of the metrics stream under
/// counter epoch `counters_epoch` (and `n_extra` more entries, for the size bound).
fn counters_heartbeat(
    sequence: u64,
    counters_epoch: u64,
    records: u64,
    n_extra: usize,
) -> Heartbeat {
    let drop = |records| wire::AgentStreamDropped {
        stream_id: uctel_protocol::stream::METRICS,
        reason: wire::AgentDropReason::NoCredit as i32,
        frames: 1,
        records,
    };
    let mut dropped = vec![drop(records)];
    dropped.extend((0..n_extra).map(|_| drop(0)));
    Heartbeat {
        sequence,
        timestamp_ns: 1,
        agent_counters: Some(wire::AgentCounters {
            counters_epoch,
            sent: vec![wire::AgentStreamSent {
                stream_id: uctel_protocol::stream::METRICS,
                frames: sequence,
                records: 10 * sequence,
            }],
            dropped,
        }),
        ..Heartbeat::default()
    }
}

const NO_CREDIT_OF_COUNTED: &str = "uctel_collector_agent_records_dropped_total{agent=\"counted\",reason=\"no_credit\",stream=\"metrics\"}";

async fn no_credit_shows(running: &uctel_collector::Running, want: f64) {
    eventually(&format!("{NO_CREDIT_OF_COUNTED} == {want}"), || {
        let text = running.render_metrics().ok()?;
        (sample(&text, NO_CREDIT_OF_COUNTED) == Some(want)).then_some(())
    })
    .await;
}

/// The agent's drop counters from its heartbeats stay one monotonic collector counter:
/// sessions of one agent process (one counter epoch, new connection epochs) continue it, an
/// agent restart (a new counter epoch) adds on top, a figure going back adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_counters_stay_monotonic_across_reconnects_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let running = uctel_collector::start(collector_config(dir.path()))
        .await
        .unwrap();
    let addr = running.control_addr();
    // First session of the process with counter epoch 77.
    let mut ch = authenticated(addr, "counted", 1).await;
    ch.send(counters_heartbeat(1, 77, 40, 0)).await.unwrap();
    ch.send(counters_heartbeat(2, 77, 55, 0)).await.unwrap();
    no_credit_shows(&running, 55.0).await;
    ch.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    // A reconnect of the same process (new connection epoch, same counters): +5, not +60.
    let mut ch = authenticated(addr, "counted", 2).await;
    ch.send(counters_heartbeat(3, 77, 60, 0)).await.unwrap();
    no_credit_shows(&running, 60.0).await;
    ch.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    // The agent restarted: counter epoch 78 counts from zero again; the collector adds on.
    let mut ch = authenticated(addr, "counted", 3).await;
    ch.send(counters_heartbeat(1, 78, 5, 0)).await.unwrap();
    no_credit_shows(&running, 65.0).await;
    // A figure going back in its own epoch adds nothing, and is not counted twice later.
    ch.send(counters_heartbeat(2, 78, 3, 0)).await.unwrap();
    ch.send(counters_heartbeat(3, 78, 9, 0)).await.unwrap();
    no_credit_shows(&running, 69.0).await;
    let text = running.render_metrics().unwrap();
    assert_eq!(
        sample(
            &text,
            "uctel_collector_agent_records_sent_total{agent=\"counted\",stream=\"metrics\"}"
        ),
        Some(60.0),
        "records sent: epoch 77's last figure 30, then epoch 78's 30"
    );
    ch.send(Goodbye::default()).await.unwrap();
    agents_connected(&running, 0.0).await;
    running.stop().await.unwrap();
}
