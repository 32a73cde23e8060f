//! `uctel-collector`'s `operator` tests in a process of their own: they install a global log
//! subscriber and count the warnings of the whole process ("one warning per minute"), which
//! the collectors of other modules would add to (`adversarial_control` uses the agent id
//! `twin` too). `cargo test -p uctel-collector --test operator`.

mod operator;
#[path = "../it/support/mod.rs"]
mod support;
