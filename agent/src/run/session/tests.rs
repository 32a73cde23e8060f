//! The session's composition on a virtual clock: every `now` is explicit, nothing sleeps.
//! The lanes are real (soft UC and RC QPs on 127.0.0.1, not connected: the tests post
//! nothing to them); the frames a test needs "posted" are taken from the pipeline and
//! marked sent, as a post does.

use super::*;
use crate::sender::core::Poll;
use uctel_protocol::control::{LaneReport, Report};
use uctel_protocol::payload::LogRecord;

const HB: Duration = Duration::from_millis(100);

fn config(rc: bool) -> AgentConfig {
    let streams = if rc {
        "streams:\n  logs:\n    reliability: rc\n"
    } else {
        ""
    };
    let text =
        format!("agent_id: a\ncollector:\n  control: 127.0.0.1:1\nauth:\n  token: t\n{streams}");
    AgentConfig::from_yaml("t.yaml", &text).unwrap_or_else(|e| panic!("{e}"))
}

fn sender_config(c: &AgentConfig, reliability: Reliability, window: u64) -> SenderConfig {
    SenderConfig {
        limits: Limits::default(),
        pacing: None,
        credit_window: window,
        first_conn_seq: 0,
        first_stream_seq: 0,
        data_paths: [DataPath::WriteWithImm; 3],
        flush_after: [Duration::from_millis(1); 3],
        ready_frames: 8,
        idle_heartbeat: None,
        wait_for_credit: [false; 3],
        carries: lane::carries(c, reliability),
    }
}

/// A session at `t0` with a UC lane and, when `rc`, an RC lane carrying the logs; both
/// lanes with a window of `window` frames.
fn session(rc: bool, window: u64, t0: Instant) -> (Session, Queues) {
    let c = config(rc);
    let ip = "127.0.0.1".parse().unwrap_or_else(|e| panic!("{e}"));
    let plane = DataPlane::open(&c, ip, 1024, QpType::Uc).unwrap_or_else(|e| panic!("{e}"));
    let rc_plane = lane::open_plane(&c, ip, &plane).unwrap_or_else(|e| panic!("{e}"));
    let core = |r| {
        SenderCore::new_unexported(&sender_config(&c, r, window), 1, t0)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let uc = Lane::new(Reliability::Uc, plane, core(Reliability::Uc), window);
    let rc = rc_plane.map(|p| {
        let mut core = core(Reliability::Rc);
        core.set_settle_on_ack(true);
        Lane::new(Reliability::Rc, p, core, window)
    });
    assert_eq!(rc.is_some(), rc_planned(&c));
    let stats = Arc::new(SelfMetrics::new().unwrap_or_else(|e| panic!("{e}")));
    let timing = Timing {
        heartbeat_every: HB,
        heartbeat_timeout: Duration::ZERO,
        report_interval: HB,
    };
    let addr = "127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
    let s = Session::new(1, addr, Lanes::new(uc, rc), timing, stats, t0);
    (s, Queues::new(&c))
}

fn rc_planned(c: &AgentConfig) -> bool {
    !c.streams.rc_streams().is_empty()
}

/// Three log frames into the lane `index`'s pipeline; the first taken and marked sent (as
/// a post does; on an RC lane also acknowledged, as its completion says), the others find
/// no credit with a window of one.
fn starve(s: &mut Session, index: usize, t0: Instant) {
    let lane = s
        .lanes
        .get_mut(index)
        .unwrap_or_else(|| panic!("no lane {index}"));
    for i in 0..3 {
        let r = LogRecord {
            message: format!("line {i}"),
            ..Default::default()
        };
        lane.core.push_log(&r, t0, 1);
        lane.core.flush(Stream::Logs);
    }
    while let Poll::Transmit(t) = lane.core.poll_transmit(t0, 1) {
        lane.core.sent(&t);
    }
    if lane.reliability == Reliability::Rc {
        let _ = lane.core.on_acked(0);
    }
}

fn heartbeat_seq(r: Result<Option<Heartbeat>, SessionEnd>) -> Option<u64> {
    match r {
        Ok(hb) => hb.map(|h| h.sequence),
        Err(e) => panic!("the session ended: {e:?}"),
    }
}

fn heard(s: &mut Session, now: Instant) {
    let msg = ControlMessage::from(Heartbeat::default());
    let mut demand = DemandMeter::default();
    if let Err(e) = s.on_control(now, Ok(msg), &mut demand) {
        panic!("a heartbeat ended the session: {e:?}");
    }
}

#[test]
fn heartbeats_follow_the_period_and_silence_ends_the_session() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let (mut s, _q) = session(false, 8, t0);
    // The first heartbeat at once, then one per period, on time.
    assert_eq!(heartbeat_seq(s.on_liveness(t0)), Some(1));
    assert_eq!(heartbeat_seq(s.on_liveness(ms(50))), None, "woken early");
    assert_eq!(s.liveness_due(), Some(ms(100)));
    assert_eq!(heartbeat_seq(s.on_liveness(ms(100))), Some(2));
    assert_eq!(heartbeat_seq(s.on_liveness(ms(200))), Some(3));
    // Heard at 250 ms: dead only 3 periods later.
    heard(&mut s, ms(250));
    assert_eq!(heartbeat_seq(s.on_liveness(ms(540))), Some(4));
    match s.on_liveness(ms(550)) {
        Err(SessionEnd::Lost(why, LostOn::Control)) => {
            assert!(
                why.contains("nothing heard from the collector for 300ms"),
                "{why}"
            );
        }
        other => panic!("not lost on silence: {other:?}"),
    }
    assert_eq!(
        s.liveness_due(),
        None,
        "no more heartbeats to a dead collector"
    );
}

#[test]
fn silence_of_three_periods_without_a_message_ends_the_session() {
    let t0 = Instant::now();
    let (mut s, _q) = session(true, 8, t0);
    assert_eq!(heartbeat_seq(s.on_liveness(t0)), Some(1));
    let just_before = t0 + Duration::from_millis(299);
    assert_eq!(heartbeat_seq(s.on_liveness(just_before)), Some(2));
    assert!(matches!(
        s.on_liveness(t0 + Duration::from_millis(300)),
        Err(SessionEnd::Lost(_, LostOn::Control))
    ));
}

#[test]
fn a_lane_out_of_credit_sends_one_heartbeat_now_repeating_the_periodic_sequence() {
    let t0 = Instant::now();
    let (mut s, q) = session(false, 1, t0);
    let mut demand = DemandMeter::default();
    assert_eq!(heartbeat_seq(s.on_liveness(t0)), Some(1));
    // Nothing to send: no early heartbeat.
    assert_eq!(heartbeat_seq(s.on_wake(&q, &mut demand)), None);
    starve(&mut s, 0, t0);
    let hb = match s.on_wake(&q, &mut demand) {
        Ok(Some(hb)) => hb,
        other => panic!("no credit heartbeat: {other:?}"),
    };
    assert_eq!(hb.sequence, 1, "not a period of its own");
    assert!(hb.frames_without_credit.is_some_and(|n| n > 0), "{hb:?}");
    assert!(hb.agent_counters.is_some());
    assert_eq!(hb.sent_conn_seq, Some(0));
    // At most once per report: the next wake stays quiet, the period goes on.
    assert_eq!(heartbeat_seq(s.on_wake(&q, &mut demand)), None);
    assert_eq!(heartbeat_seq(s.on_liveness(t0 + HB)), Some(2));
    // Waiting for credit: only a report (or records) wakes the send path.
    assert_eq!(s.next_wake(t0 + HB), None);
}

#[test]
fn the_collectors_drain_ends_the_session_with_a_reconnect_goodbye() {
    let t0 = Instant::now();
    let (mut s, _q) = session(true, 1, t0);
    starve(&mut s, 1, t0);
    let mut demand = DemandMeter::default();
    let bye = control::Goodbye {
        reason: GoodbyeReason::Drain as i32,
        detail: "draining".into(),
        ..control::Goodbye::default()
    };
    let end = match s.on_control(t0, Ok(ControlMessage::from(bye)), &mut demand) {
        Err(end @ SessionEnd::Drain(_)) => end,
        other => panic!("not a drain: {other:?}"),
    };
    assert!(matches!(&end, SessionEnd::Drain(d) if d == "draining"));
    let words = s.last_words(&end);
    assert_eq!(words.label, "drain");
    assert_eq!(words.goodbye.reason, GoodbyeReason::Reconnect as i32);
    assert_eq!(
        words.goodbye.detail,
        "the collector is draining; moving to the next collector"
    );
    // The logs travel on the RC lane: their final figures are its pipeline's.
    assert_eq!(
        words.goodbye.final_conn_seq, None,
        "the UC lane sent nothing"
    );
    assert_eq!(words.goodbye.rc_final_conn_seq, Some(0));
    let logs = &words.goodbye.streams[Stream::Logs.index()];
    assert_eq!(logs.final_stream_seq, Some(0));
    assert_eq!(logs.final_record_count, 1);
    // A planned end says its counters first.
    let hb = words
        .heartbeat
        .unwrap_or_else(|| panic!("no last heartbeat"));
    assert_eq!(hb.rc_sent_conn_seq, Some(0));
    assert!(hb.agent_counters.is_some());

    // Any other Goodbye of the collector is a lost control connection: no last heartbeat.
    let (mut s, _q) = session(true, 1, t0);
    let bye = control::Goodbye {
        reason: GoodbyeReason::Shutdown as i32,
        detail: "stopping".into(),
        ..control::Goodbye::default()
    };
    let end = match s.on_control(t0, Ok(ControlMessage::from(bye)), &mut demand) {
        Err(end @ SessionEnd::Lost(_, LostOn::Control)) => end,
        other => panic!("not lost: {other:?}"),
    };
    let words = s.last_words(&end);
    assert_eq!(words.label, "lost");
    assert!(words.heartbeat.is_none());
    assert_eq!(words.goodbye.reason, GoodbyeReason::Reconnect as i32);
    assert!(words.goodbye.detail.contains("said goodbye: stopping"));
}

#[test]
fn every_lane_gets_its_part_of_a_report_and_of_a_heartbeat() {
    let t0 = Instant::now();
    for rc in [false, true] {
        let (mut s, q) = session(rc, 1, t0);
        assert_eq!(s.lanes.len(), if rc { 2 } else { 1 });
        let last = s.lanes.len() - 1;
        starve(&mut s, last, t0);
        let hb = s
            .on_liveness(t0)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no heartbeat"));
        // Only a session with an RC lane names it in its heartbeat.
        assert_eq!(hb.rc_sent_conn_seq, rc.then_some(0));
        assert_eq!(hb.rc_frames_without_credit.is_some(), rc);
        assert_eq!(hb.sent_conn_seq, (!rc).then_some(0));

        let mut demand = DemandMeter::default();
        // The lanes take turns at stepping first: the RC lane on the first wake.
        let mut turns = Vec::new();
        for _ in 0..3 {
            if let Err(e) = s.on_wake(&q, &mut demand) {
                panic!("{e:?}");
            }
            turns.push(s.turn);
        }
        assert_eq!(turns, if rc { vec![1, 0, 1] } else { vec![0, 0, 0] });

        // The lane that sent frame 0 is out of credit until the report gives it back,
        // whichever lane it is.
        assert_eq!(
            s.lanes.iter().nth(last).map(|l| l.core.credits_available()),
            Some(0)
        );
        let report = Report {
            consumed_conn_seq: 0,
            conn_received: 1,
            rc_lane: rc.then(|| LaneReport {
                consumed_conn_seq: Some(0),
                ..LaneReport::default()
            }),
            ..Report::default()
        };
        s.on_control(t0, Ok(ControlMessage::from(report)), &mut demand)
            .unwrap_or_else(|e| panic!("{e:?}"));
        for l in s.lanes.iter() {
            assert_eq!(l.core.credits_available(), 1, "{:?}", l.reliability);
        }
    }
}

/// A credit word region of its own (the collector writes nothing into it here).
fn word_region() -> uctel_transport::api::MemoryRegion {
    use uctel_transport::api::{AccessFlags, Device};
    use uctel_transport::soft::device::{SoftConfig, SoftDevice};
    use uctel_transport::soft::udp::UdpConfig;
    // An ephemeral port: tests run side by side.
    let config = SoftConfig {
        udp: UdpConfig {
            bind: "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
            ..UdpConfig::default()
        },
        ..SoftConfig::default()
    };
    let dev = Device::from(SoftDevice::open(&config).unwrap_or_else(|e| panic!("{e}")));
    let pd = dev.alloc_pd().unwrap_or_else(|e| panic!("{e}"));
    pd.reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// 2,000 log lines queued for the UC lane of `s` (window 4), whose logs wait for credit;
/// the pipeline takes what the credits leave room for (three frames of four credits, one
/// kept for the streams that drop) and they go, as posts do. Returns the frames sent.
fn send_a_waiting_backlog(s: &mut Session, q: &Queues, t0: Instant) -> usize {
    let c = config(false);
    let mut waits = sender_config(&c, Reliability::Uc, 4);
    waits.wait_for_credit = [true, true, false];
    let backlog = (0..2000).map(|i| LogRecord {
        message: format!("backlog line {i} {}", "x".repeat(60)),
        ..Default::default()
    });
    assert_eq!(q.logs.offer(backlog), 0, "the queue refused records");
    let lane = s.lanes.get_mut(0).unwrap_or_else(|| panic!("no UC lane"));
    lane.core = SenderCore::new_unexported(&waits, 1, t0).unwrap_or_else(|e| panic!("{e}"));
    pump::pull(&mut lane.core, q, &s.stats);
    lane.core.flush(Stream::Logs);
    let mut sent = 0;
    while let Poll::Transmit(t) = lane.core.poll_transmit(t0, 1) {
        lane.core.sent(&t);
        sent += 1;
    }
    sent
}

#[test]
fn log_records_left_queued_for_credit_ask_for_it_and_keep_the_credit_word_read() {
    let t0 = Instant::now();
    let (mut s, q) = session(false, 4, t0);
    assert_eq!(send_a_waiting_backlog(&mut s, &q, t0), 3);
    // No frame found no credit: the reserve is left.
    assert_eq!(s.lanes.uc().core.credits_available(), 1);
    assert!(!q.logs.is_empty());
    // Yet the wake asks for credit at once: records wait for it in the queue.
    let mut demand = DemandMeter::default();
    let hb = match s.on_wake(&q, &mut demand) {
        Ok(Some(hb)) => hb,
        other => panic!("no heartbeat asking for credit: {other:?}"),
    };
    assert_eq!(hb.frames_without_credit, Some(1), "{hb:?}");
    assert!(s.lanes.uc().core.records_waiting());
    // Once per report: the next wake stays quiet.
    assert_eq!(heartbeat_seq(s.on_wake(&q, &mut demand)), None);
    // Without credit writes only a report wakes the send path; with them, the session
    // reads its credit word while the records wait (nothing else wakes it when one lands).
    assert_eq!(s.next_wake(t0), None);
    s.set_credit_reader(Some(CreditReader::new(word_region(), 1)));
    assert_eq!(s.next_wake(t0), Some(t0 + CREDIT_WORD_POLL));
    // A report gives the credits back: more records go into frames, and those still queued
    // ask again (once per report).
    let report = Report {
        consumed_conn_seq: 2,
        conn_received: 3,
        ..Report::default()
    };
    s.on_control(t0, Ok(ControlMessage::from(report)), &mut demand)
        .unwrap_or_else(|e| panic!("{e:?}"));
    let lane = s.lanes.get_mut(0).unwrap_or_else(|| panic!("no UC lane"));
    pump::pull(&mut lane.core, &q, &s.stats);
    assert!(lane.core.ready_frames() > 0);
    assert!(lane.core.records_waiting());
    assert!(lane.core.take_credit_heartbeat());
}

/// The last frames at shutdown take credit as the session does: with frames left and no
/// credit they ask for it once per grant, the credit word is read (a word written while
/// they wait applies), and the wait for credit is the word's poll period, not the whole
/// grace (credit writes make Reports rare).
#[test]
fn the_last_frames_ask_for_credit_and_read_the_credit_word() {
    use uctel_protocol::control::CreditWord;
    let t0 = Instant::now();
    let (mut s, q) = session(false, 4, t0);
    let until = t0 + Duration::from_secs(2);
    // Without credit writes, only a Report ends the wait for credit.
    assert_eq!(s.finish_wait(Stop::Wait(None), false, t0, until), until);
    assert_eq!(
        s.finish_wait(Stop::Wait(None), true, t0, until),
        t0 + BUSY_RETRY
    );
    let region = word_region();
    s.set_credit_reader(Some(CreditReader::new(region.clone(), 1)));
    assert_eq!(
        s.finish_wait(Stop::Wait(None), false, t0, until),
        t0 + CREDIT_WORD_POLL
    );
    // Pacing that allows sooner still wins.
    let soon = t0 + Duration::from_micros(100);
    assert_eq!(
        s.finish_wait(Stop::Wait(Some(soon)), false, t0, until),
        soon
    );

    assert_eq!(
        s.credit_ask().map(|hb| hb.sequence),
        None,
        "no frame found no credit"
    );
    assert_eq!(
        send_a_waiting_backlog(&mut s, &q, t0),
        3,
        "one window but the reserve"
    );
    assert!(!q.logs.is_empty() && s.lanes.uc().core.records_waiting());
    let hb = s
        .credit_ask()
        .unwrap_or_else(|| panic!("no ask for credit"));
    assert_eq!(hb.frames_without_credit, Some(1), "{hb:?}");
    assert!(s.credit_ask().is_none(), "asked twice for one grant");

    // The collector's answer lands in the word: the next read gives the credit.
    assert_eq!(s.lanes.uc().core.credits_available(), 1);
    let word = CreditWord {
        generation: 1,
        grant_sequence: 1,
        grant_limit: 3 + 8,
        consumed_next: 3,
    };
    region
        .write_at(0, &word.encode())
        .unwrap_or_else(|e| panic!("{e}"));
    s.read_credit_word();
    // All three frames consumed: the whole window of four is free again (the grant's
    // limit reaches beyond it; the window caps what is outstanding).
    assert_eq!(s.lanes.uc().core.credits_available(), 4);
}
