//! The agent's OpenMetrics reader on arbitrary text: `openmetrics::to_text` must never
//! panic, and what it writes must be text the exposition parser reads without panicking
//! (the scrape source's path for an OpenMetrics answer).
#![no_main]

use libfuzzer_sys::fuzz_target;
use uctel_agent::sources::exposition::{parse, Timestamps};
use uctel_agent::sources::openmetrics::to_text;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(converted) = to_text(text) {
        let _ = parse(
            &converted,
            &|name: &str| format!("{name} (fuzz)"),
            Timestamps::Keep,
        );
    }
});
