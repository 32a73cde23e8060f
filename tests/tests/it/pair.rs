//! Property tests of the whole data pipeline ([`uctel_tests::pair`]): agent sender → seeded
//! lossy, duplicating, reordering link → collector ingest, on a virtual clock. At quiescence
//! after the `Goodbye`, per stream, frames and records sent `== received + lost + dropped`
//! (the product's terms; on the fast_counters stream a record is a sample); at every step
//! `received + lost (+ missing) ≤ sent`; no record is delivered twice. A scenario that does not quiesce within a bounded number of steps fails.

use proptest::prelude::*;
use uctel_agent::stream::Stream;
use uctel_tests::pair::{LinkFaults, Op, Pair, PairConfig, PairError};

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..12).prop_map(Op::Metrics),
        6 => (1u8..12).prop_map(Op::Logs),
        // Up to 120 samples: some series span several frames' worth and are refused
        // (oversize), counted by their samples.
        3 => (1u8..120).prop_map(Op::Samples),
        1 => Just(Op::Flush(Stream::FastCounters)),
        2 => Just(Op::Flush(Stream::Metrics)),
        2 => Just(Op::Flush(Stream::Logs)),
        5 => (1u32..3000).prop_map(Op::Advance),
        1 => (5_000u32..12_000).prop_map(Op::Advance),
        3 => Just(Op::Report),
        3 => Just(Op::CreditWrite),
    ]
}

fn faults() -> impl Strategy<Value = LinkFaults> {
    (
        prop_oneof![Just(0u32), 0u32..400],
        prop_oneof![Just(0u32), 0u32..200],
        prop_oneof![Just(0u32), 0u32..500],
        1u32..3000,
    )
        .prop_map(|(drop, duplicate, reorder, max_delay_us)| LinkFaults {
            drop,
            duplicate,
            reorder,
            max_delay_us,
        })
}

fn config() -> impl Strategy<Value = PairConfig> {
    (
        any::<u64>(),
        faults(),
        prop_oneof![2u64..8, 8u64..64],
        any::<bool>(),
        prop_oneof![Just(256usize), Just(512), Just(1400)],
        prop_oneof![Just(64u64), 1u64..16],
        prop_oneof![Just(None), faults().prop_map(Some)],
    )
        .prop_map(
            |(
                seed,
                faults,
                credit_window,
                logs_wait_for_credit,
                max_frame_bytes,
                reorder_window,
                credit_words,
            )| {
                PairConfig {
                    seed,
                    faults,
                    credit_window,
                    logs_wait_for_credit,
                    max_frame_bytes,
                    reorder_window,
                    credit_words,
                    dictionary: false,
                }
            },
        )
}

fn run(cfg: &PairConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut pair = Pair::new(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match pair.run(ops) {
        Ok(_) => Ok(()),
        Err(e @ (PairError::Law(_) | PairError::Hang(_) | PairError::Setup(_))) => {
            Err(TestCaseError::fail(e.to_string()))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn sent_equals_received_plus_lost_plus_dropped_per_stream(
        cfg in config(),
        ops in prop::collection::vec(op(), 0..120),
    ) {
        run(&cfg, &ops)?;
    }
}

/// A lossless link delivers every record exactly once and loses nothing.
#[test]
fn a_clean_link_delivers_everything() {
    let cfg = PairConfig {
        seed: 1,
        faults: LinkFaults::default(),
        credit_window: 1000,
        logs_wait_for_credit: false,
        max_frame_bytes: 512,
        reorder_window: 64,
        credit_words: None,
        dictionary: false,
    };
    let mut pair = Pair::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let ops = [
        Op::Metrics(10),
        Op::Logs(10),
        Op::Advance(3000),
        Op::Metrics(5),
        Op::Report,
    ];
    let out = pair.run(&ops).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.pushed, [15, 10, 0]);
    assert_eq!(out.delivered, 25);
    for l in out.ledger {
        assert_eq!((l.lost, l.records_lost, l.duplicate), (0, 0, 0), "{l:?}");
    }
}

/// A link that drops, duplicates and reorders heavily: the laws still hold, and loss is seen.
#[test]
fn a_bad_link_loses_frames_and_the_books_still_balance() {
    let cfg = PairConfig {
        seed: 7,
        faults: LinkFaults {
            drop: 300,
            duplicate: 200,
            reorder: 400,
            max_delay_us: 2000,
        },
        credit_window: 16,
        logs_wait_for_credit: true,
        max_frame_bytes: 256,
        reorder_window: 8,
        credit_words: None,
        dictionary: false,
    };
    let mut pair = Pair::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut ops = Vec::new();
    for _ in 0..30 {
        ops.extend([Op::Metrics(6), Op::Logs(6), Op::Advance(700), Op::Report]);
    }
    let out = pair.run(&ops).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.link_dropped > 0);
    assert!(out.ledger.iter().map(|l| l.lost).sum::<u64>() > 0);
}

/// Credits that come only as words written into the agent's memory, over a reverse link that
/// drops 30 %, duplicates 20 % and reorders 40 % of them (no `Report` at all): the agent's
/// window of 4 frames moves on by the words it reads, it never posts a frame at or beyond the
/// limit of the newest grant it read (checked at every post), and the books balance.
#[test]
fn credit_words_over_a_lossy_reverse_link_carry_the_window() {
    let cfg = PairConfig {
        seed: 11,
        faults: LinkFaults::default(),
        credit_window: 4,
        logs_wait_for_credit: true,
        max_frame_bytes: 256,
        reorder_window: 8,
        credit_words: Some(LinkFaults {
            drop: 300,
            duplicate: 200,
            reorder: 400,
            max_delay_us: 3000,
        }),
        dictionary: false,
    };
    let mut pair = Pair::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut ops = Vec::new();
    for _ in 0..60 {
        ops.extend([Op::Logs(5), Op::Advance(700), Op::CreditWrite]);
    }
    let out = pair.run(&ops).unwrap_or_else(|e| panic!("{e}"));
    let words = pair.words.as_ref().unwrap_or_else(|| panic!("words on"));
    assert!(
        words.link.dropped > 0 && words.link.duplicated > 0,
        "{:?}",
        words.link
    );
    assert!(words.applied > 10, "words applied {}", words.applied);
    // Far more frames than one window: the credit came back through the words.
    assert!(out.frames_posted > 10 * cfg.credit_window, "{out:?}");
    assert_eq!(out.delivered as u64, out.pushed[1], "{out:?}");
}

/// A scenario of the series-dictionary churn test: series appear every few frames and
/// vanish, the agent restarts (a new epoch), reports (with their `DictAck`s) come and go,
/// long pauses let unreferenced definitions go out alone.
fn churn_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1u8..24).prop_map(Op::Metrics),
        3 => (1u8..6).prop_map(Op::Appear),
        2 => (1u8..4).prop_map(Op::Vanish),
        1 => Just(Op::Restart),
        4 => Just(Op::Report),
        2 => Just(Op::Flush(Stream::Metrics)),
        1 => (1u8..4).prop_map(Op::Logs),
        5 => (1u32..3000).prop_map(Op::Advance),
        1 => (5_000u32..12_000).prop_map(Op::Advance),
        1 => (1_000_000u32..1_600_000).prop_map(Op::Advance),
    ]
}

fn churn_config() -> impl Strategy<Value = PairConfig> {
    (config(), any::<bool>()).prop_map(|(mut cfg, words)| {
        cfg.dictionary = true;
        if !words {
            cfg.credit_words = None;
        }
        cfg
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// With the series dictionary on, under seeded loss, duplication and reordering, series
    /// churn and epoch changes: at every step no sample is delivered under a name, label,
    /// help or type not its own (each value encodes its series), no frame posted references
    /// a series the collector has not acknowledged in this epoch without defining it, no
    /// frame is dropped as malformed, and no record is delivered twice; at each epoch's
    /// quiescence the books balance (records = samples).
    #[test]
    fn dictionary_churn_never_puts_a_sample_under_a_wrong_series(
        cfg in churn_config(),
        ops in prop::collection::vec(churn_op(), 0..150),
    ) {
        let mut all = vec![Op::Appear(4)];
        all.extend(ops);
        run(&cfg, &all)?;
    }
}

/// One fixed churn scenario on a link that drops 20 %, duplicates 10 % and reorders 30 %:
/// three epochs, series that come and go every few frames; the dictionary is used (the
/// collector acknowledged entries, so frames went out with values only), loss is seen,
/// every sample that arrived is under its own series and the books balance.
#[test]
fn dictionary_churn_on_a_bad_link_over_three_epochs() {
    let cfg = PairConfig {
        seed: 43,
        faults: LinkFaults {
            drop: 200,
            duplicate: 100,
            reorder: 300,
            max_delay_us: 2000,
        },
        credit_window: 32,
        logs_wait_for_credit: false,
        max_frame_bytes: 512,
        reorder_window: 8,
        credit_words: None,
        dictionary: true,
    };
    let mut pair = Pair::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut ops = Vec::new();
    for epoch in 0..3 {
        if epoch > 0 {
            ops.push(Op::Restart);
        }
        for round in 0..20 {
            ops.extend([
                Op::Appear(2),
                Op::Metrics(20),
                Op::Advance(2500),
                Op::Report,
            ]);
            if round % 3 == 0 {
                ops.push(Op::Vanish(3));
            }
        }
    }
    let out = pair.run(&ops).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.epochs, 3, "{out:?}");
    assert_eq!(out.pushed[Stream::Metrics.index()], 3 * 20 * 20, "{out:?}");
    assert!(out.link_dropped > 0, "{out:?}");
    let metrics = out.ledger[Stream::Metrics.index()];
    assert!(metrics.lost > 0 && metrics.records_received > 0, "{out:?}");
    assert!(
        pair.dictionary_acked() > 10,
        "acknowledged {}",
        pair.dictionary_acked()
    );
}
