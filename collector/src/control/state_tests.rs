//! [`SessionState`] on a virtual clock: every `now` is an explicit `Instant`, nothing sleeps.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uctel_protocol::control::{Body, Goodbye, GoodbyeReason, Heartbeat, Probe};

use super::*;
use crate::control::registry::{replace, Admission, Registry, SessionLink};
use crate::telemetry::{SessionEnd, Telemetry};

const S: Duration = Duration::from_secs(1);

/// Heartbeats every 2 s, dead after 3 missed, reports every second (the operator tests'
/// configuration).
fn timing() -> Timing {
    Timing {
        heartbeat: 2 * S,
        dead_after_missed: 3,
        report_every: S,
    }
}

fn heartbeat(sent: Option<u64>, without_credit: Option<u64>) -> Option<Body> {
    Some(Body::Heartbeat(Heartbeat {
        sent_conn_seq: sent,
        frames_without_credit: without_credit,
        ..Heartbeat::default()
    }))
}

fn beat(state: &mut SessionState, now: Instant) -> Option<u64> {
    match state.on_liveness(now) {
        Ok(hb) => hb.map(|h| h.sequence),
        Err(flow) => panic!("the session ended at {now:?}: {flow:?}"),
    }
}

#[test]
fn heartbeats_go_out_on_time_and_a_silent_agent_is_dead_after_three_periods() {
    let t0 = Instant::now();
    let mut state = SessionState::new(timing(), Arc::new(SessionLink::new(t0)), t0);
    assert_eq!(state.dead_after(), 6 * S);
    assert_eq!(beat(&mut state, t0), Some(1));
    assert_eq!(state.liveness_deadline(), Some(t0 + 2 * S));
    // Woken early: nothing.
    assert_eq!(beat(&mut state, t0 + S), None);
    assert_eq!(beat(&mut state, t0 + 2 * S), Some(2));
    // Heard at 3 s: dead at 9 s, not at 6 s.
    assert!(matches!(
        state.on_message(heartbeat(None, None), t0 + 3 * S),
        Heard::Heartbeat(_)
    ));
    assert_eq!(beat(&mut state, t0 + 4 * S), Some(3));
    assert_eq!(beat(&mut state, t0 + 6 * S), Some(4));
    assert_eq!(beat(&mut state, t0 + 8 * S), Some(5));
    let Err(Flow::End(Some(ending))) = state.on_liveness(t0 + 9 * S) else {
        panic!("the agent silent for 6 s is not dead");
    };
    assert_eq!(ending, (GoodbyeReason::Error, "heartbeats missed"));
    // Declared once: no more deadline.
    assert_eq!(state.liveness_deadline(), None);
    let closing = state.close(Some(ending), None, t0 + 9 * S);
    assert!(closing.vanished);
    assert_eq!(closing.ended_by, "no heartbeat for 6.0s (at most 6s)");
    assert_eq!(closing.end, SessionEnd::NoGoodbye);
    assert_eq!(closing.connected_for, 9 * S);
    let sent = closing.send.expect("the collector's Goodbye");
    assert_eq!(sent.reason, GoodbyeReason::Error as i32);
    assert_eq!(sent.detail, "heartbeats missed");
}

/// A session silent for longer than one and a half heartbeat intervals (3 s here) is
/// replaced quietly by a new connection of its agent id, counted as
/// `connections_replaced_total{previous="silent"}`, and its agent hears why; while it was
/// heard within that time, a second connection is a twin and refused.
#[tokio::test(flavor = "current_thread")]
async fn a_session_silent_for_one_and_a_half_heartbeats_is_replaced_quietly() {
    let t0 = Instant::now();
    let registry = Registry::default();
    let telemetry = Telemetry::new().unwrap();
    let peer = SocketAddr::from(([127, 0, 0, 1], 4000));
    let alive_within = timing().heartbeat.mul_f64(1.5);
    let link = Arc::new(SessionLink::new(t0));
    let mut state = SessionState::new(timing(), link.clone(), t0);
    let (trigger, _cancel) = uctel_common::shutdown::channel();
    let (done_tx, done) = tokio::sync::watch::channel(false);
    let first = registry.admit(
        "restarted",
        peer,
        1,
        alive_within,
        trigger,
        done,
        link.clone(),
        t0,
    );
    assert!(matches!(first, Admission::Admitted { previous: None, .. }));
    // The agent's last message at 1 s.
    let _ = state.on_message(heartbeat(Some(5), None), t0 + S);
    let second = |now: Instant| {
        let (trigger, _) = uctel_common::shutdown::channel();
        let (_, done) = tokio::sync::watch::channel(false);
        let link = Arc::new(SessionLink::new(now));
        registry.admit("restarted", peer, 2, alive_within, trigger, done, link, now)
    };
    // Heard 3 s ago: alive, a second connection is refused.
    let Admission::Alive { silent_for, .. } = second(t0 + 4 * S) else {
        panic!("a session heard 3 s ago was displaced");
    };
    assert_eq!(silent_for, 3 * S);
    // Heard 3.5 s ago: silent, displaced and replaced.
    let now = t0 + S + Duration::from_millis(3500);
    let Admission::Admitted {
        previous: Some(previous),
        ..
    } = second(now)
    else {
        panic!("the silent session was not displaced");
    };
    done_tx.send(true).unwrap();
    replace(
        &registry,
        &telemetry,
        timing().heartbeat,
        "restarted",
        peer,
        2,
        previous,
        now,
    )
    .await;
    let text = String::from_utf8(telemetry.render().unwrap()).unwrap();
    assert!(
        text.contains(
            "uctel_collector_connections_replaced_total{agent=\"restarted\",previous=\"silent\"} 1"
        ),
        "{text}"
    );
    assert!(
        !text.contains("{agent=\"restarted\",previous=\"alive\"}"),
        "{text}"
    );
    // The replaced session tells its agent why.
    let ending = (
        GoodbyeReason::Reconnect,
        "replaced by a newer connection of this agent",
    );
    let closing = state.close(Some(ending), link.take_replaced_by(), now);
    assert_eq!(closing.end, SessionEnd::Replaced);
    assert!(!closing.vanished);
    let bye = closing.send.expect("a Goodbye");
    assert_eq!(bye.reason, GoodbyeReason::Reconnect as i32);
    assert!(
        bye.detail.contains("this connection was silent for 3.5s"),
        "{}",
        bye.detail
    );
}

#[test]
fn an_agent_out_of_credit_gets_its_report_half_an_interval_after_the_last() {
    let t0 = Instant::now();
    let mut state = SessionState::new(timing(), Arc::new(SessionLink::new(t0)), t0);
    // Credit in hand: no early report.
    let _ = state.on_message(heartbeat(Some(3), Some(0)), t0 + Duration::from_millis(100));
    assert_eq!(state.early_due(), None);
    // Out of credit at 0.2 s: due half an interval after the last report (at 0 s).
    let _ = state.on_message(heartbeat(Some(9), Some(4)), t0 + Duration::from_millis(200));
    assert_eq!(state.early_due(), Some(t0 + Duration::from_millis(500)));
    // The RC lane out of credit asks too.
    assert!(state.on_report(t0 + Duration::from_millis(500)).is_none());
    assert_eq!(state.early_due(), None);
    let rc_starved = Some(Body::Heartbeat(Heartbeat {
        rc_frames_without_credit: Some(1),
        ..Heartbeat::default()
    }));
    let _ = state.on_message(rc_starved, t0 + Duration::from_millis(600));
    assert_eq!(state.early_due(), Some(t0 + S));
    // A tick serves the waiting early report; frames sent a second ago are gone.
    assert_eq!(state.on_report(t0 + Duration::from_millis(1100)), Some(3));
    assert_eq!(state.early_due(), None);
    assert_eq!(state.on_report(t0 + Duration::from_millis(1300)), Some(9));
}

#[test]
fn how_a_session_ends_decides_its_goodbye_log_and_counter() {
    let t0 = Instant::now();
    let new = || SessionState::new(timing(), Arc::new(SessionLink::new(t0)), t0);
    // The agent's Goodbye.
    let mut state = new();
    let bye = Goodbye {
        final_conn_seq: Some(7),
        reason: GoodbyeReason::Shutdown as i32,
        detail: "test done\n".into(),
        ..Goodbye::default()
    };
    assert!(matches!(
        state.on_message(Some(Body::Goodbye(bye)), t0),
        Heard::End(None)
    ));
    let closing = state.close(None, None, t0 + S);
    assert_eq!(
        closing.ended_by,
        "the agent's Goodbye (shutdown: test done)"
    );
    assert_eq!(closing.end, SessionEnd::Goodbye);
    assert_eq!(closing.goodbye.and_then(|g| g.final_conn_seq), Some(7));
    assert!(closing.send.is_none() && !closing.vanished);

    // A send failed, then the agent's Goodbye was found unread: a clean goodbye after all.
    let mut state = new();
    assert!(matches!(state.on_send_failed("a report"), Flow::End(None)));
    assert!(state.send_failed());
    state.on_unread_goodbye(Goodbye::default());
    let closing = state.close(None, None, t0);
    assert!(!closing.vanished);
    assert_eq!(closing.end, SessionEnd::Goodbye);

    // A send failed and no Goodbye came: vanished.
    let mut state = new();
    let _ = state.on_send_failed("a heartbeat");
    let closing = state.close(None, None, t0);
    assert!(closing.vanished);
    assert_eq!(
        closing.ended_by,
        "the control connection failed: a heartbeat could not be sent"
    );
    assert_eq!(closing.end, SessionEnd::NoGoodbye);

    // The connection closed.
    let mut state = new();
    let _ = state.on_closed("the control connection closed without Goodbye".into());
    assert!(state.close(None, None, t0).vanished);

    // A message out of turn, an empty one.
    let mut state = new();
    assert!(matches!(
        state.on_message(Some(Body::Probe(Probe { nonce: 1 })), t0),
        Heard::Unexpected("Probe")
    ));
    let closing = state.close(Some(UNEXPECTED), None, t0);
    assert_eq!(closing.ended_by, "unexpected control message");
    assert_eq!(closing.end, SessionEnd::NoGoodbye);
    assert!(matches!(new().on_message(None, t0), Heard::End(Some(_))));

    // Shutdown: the collector's Goodbye; a replacement's detail only for a reconnect.
    let closing = new().close(
        Some((GoodbyeReason::Shutdown, "collector shutting down")),
        Some("ignored".into()),
        t0,
    );
    assert_eq!(closing.end, SessionEnd::Shutdown);
    assert_eq!(closing.ended_by, "collector shutting down");
    assert_eq!(
        closing.send.map(|g| g.detail),
        Some("collector shutting down".to_owned())
    );

    // A drain tells the agent once.
    let mut state = new();
    assert!(!state.told_to_move());
    let drain = state.on_drain();
    assert_eq!(drain.reason, GoodbyeReason::Drain as i32);
    assert_eq!(drain.detail, DRAIN_DETAIL);
    assert!(state.told_to_move());
}
