//! Counters never go down: every `*_total` series of every scrape, per daemon process.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::exposition::Scrape;

/// Remembers every `*_total` series per daemon process and flags a decrease.
#[derive(Debug, Default)]
pub struct Monotonic {
    last: HashMap<String, f64>,
    /// Decreases seen (first few kept).
    pub violations: Vec<String>,
    /// How many decreases.
    pub violation_count: u64,
    /// Scrapes observed.
    pub scrapes: u64,
}

impl Monotonic {
    /// Checks the `*_total` samples of `s` whose names start with `prefix` against the last
    /// scrape of the same process (`daemon`, `pid`).
    pub fn observe(&mut self, daemon: &str, pid: u32, prefix: &str, s: &Scrape) {
        self.scrapes += 1;
        for smp in &s.samples {
            if !(smp.name.starts_with(prefix) && smp.name.ends_with("_total")) {
                continue;
            }
            let mut key = format!("{daemon}[{pid}] {}{{", smp.name);
            for (k, v) in &smp.labels {
                let _ = write!(key, "{k}={v:?},");
            }
            key.push('}');
            if let Some(prev) = self.last.insert(key.clone(), smp.value) {
                if smp.value < prev {
                    self.violation_count += 1;
                    if self.violations.len() < 8 {
                        self.violations
                            .push(format!("{key}: {prev} -> {}", smp.value));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_flags_a_decrease_per_process() {
        let s = |v: f64| Scrape {
            samples: crate::exposition::parse(&format!("x_total{{a=\"1\"}} {v}\n"))
                .unwrap_or_default(),
            text: String::new(),
        };
        let mut m = Monotonic::default();
        m.observe("d", 1, "x_", &s(5.0));
        m.observe("d", 1, "x_", &s(6.0));
        m.observe("d", 2, "x_", &s(0.0));
        assert_eq!(m.violation_count, 0);
        m.observe("d", 1, "x_", &s(4.0));
        assert_eq!(m.violation_count, 1);
    }
}
