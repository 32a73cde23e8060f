//! The agent's Prometheus text exposition (0.0.4) parser on arbitrary text: `parse` and
//! `parse_first` must never panic (whatever the timestamps rule), and take or refuse the
//! same texts (`parse_first`'s errors are `parse`'s).
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_agent::sources::exposition::{parse, parse_first, Timestamps};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let help = |name: &str| format!("{name} (fuzz)");
    for timestamps in [Timestamps::Keep, Timestamps::Refuse] {
        let all = parse(text, &help, timestamps);
        let first = parse_first(text, &help, timestamps);
        assert_eq!(all.is_ok(), first.is_ok(), "{all:?} / {first:?}");
    }
});
