//! A tracing subscriber that keeps the agent's warn-level events (target `uctel_agent*`) as
//! ` field=value ...` lines, for tests that check what the agent says. Install it with
//! `tracing::subscriber::set_default` on the test's thread (a current-thread runtime logs
//! every task through it).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// The warn-level lines seen so far ([`Capture::warnings`]).
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<String>>>);

impl Capture {
    /// Every warn-level event of the agent so far, one ` field=value ...` line each.
    pub fn warnings(&self) -> Vec<String> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                let _ = write!(self.0, " {}={value:?}", field.name());
            }
        }
        let meta = event.metadata();
        if *meta.level() != tracing::Level::WARN || !meta.target().starts_with("uctel_agent") {
            return;
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        if let Ok(mut v) = self.0.lock() {
            v.push(fields.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
