//! Small statistics: rates, per-agent spread and fairness, and target verdicts.

use serde::Serialize;

/// `a / b`, NaN when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b != 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// `count / seconds`, or 0 when no time passed.
pub fn rate(count: f64, seconds: f64) -> f64 {
    if seconds > 0.0 && seconds.is_finite() {
        count / seconds
    } else {
        0.0
    }
}

/// Spread of per-agent throughput over one measurement window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// Agents.
    pub n: usize,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Jain's fairness index `(Σx)² / (n · Σx²)`: 1 when all agents got the same, `1/n`
    /// when one agent got everything (R. Jain, D. Chiu, W. Hawe, DEC-TR-301, 1984).
    pub jain: f64,
}

/// Min, max, mean and Jain's index of `xs`; `None` for an empty slice or when every value is
/// zero (fairness is undefined when nothing flowed).
pub fn spread(xs: &[f64]) -> Option<Spread> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len();
    let sum: f64 = xs.iter().sum();
    let sum_sq: f64 = xs.iter().map(|x| x * x).sum();
    if sum_sq <= 0.0 {
        return None;
    }
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Spread {
        n,
        min,
        max,
        mean: sum / n as f64,
        jain: sum * sum / (n as f64 * sum_sq),
    })
}

/// Which side of the bound passes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// The value must be at least the bound.
    AtLeast,
    /// The value must be at most the bound.
    AtMost,
}

/// A measured value checked against a bound measured or fixed in the same run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// Measured value.
    pub value: f64,
    /// The bound it is held to.
    pub bound: f64,
    /// Direction.
    pub goal: Goal,
    /// Whether the target is met.
    pub met: bool,
    /// `value / bound`.
    pub fraction_of_bound: f64,
}

impl Verdict {
    /// Checks `value` against `bound` in direction `goal`. A non-finite value or bound never
    /// passes.
    pub fn check(value: f64, bound: f64, goal: Goal) -> Verdict {
        let finite = value.is_finite() && bound.is_finite();
        let met = finite
            && match goal {
                Goal::AtLeast => value >= bound,
                Goal::AtMost => value <= bound,
            };
        let fraction_of_bound = if bound != 0.0 {
            value / bound
        } else {
            f64::NAN
        };
        Verdict {
            value,
            bound,
            goal,
            met,
            fraction_of_bound,
        }
    }

    /// `met`, or by how much it was missed: `short by 23 %` for an at-least target,
    /// `over by 3.10×` for an at-most target.
    pub fn describe(&self) -> String {
        if self.met {
            return "met".into();
        }
        if !self.fraction_of_bound.is_finite() {
            if self.value.is_finite() && self.bound.is_finite() {
                return format!("MISSED: {} (bound {})", self.value, self.bound);
            }
            return "not measured".into();
        }
        match self.goal {
            Goal::AtLeast => format!(
                "MISSED: short by {:.0} %",
                (1.0 - self.fraction_of_bound) * 100.0
            ),
            Goal::AtMost => format!("MISSED: {:.2}× the bound", self.fraction_of_bound),
        }
    }
}

/// A Markdown-compatible pipe table.
pub fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from("|");
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            s.push(' ');
            s.push_str(c);
            s.push_str(&" ".repeat(pad));
            s.push_str(" |");
        }
        s.push('\n');
        s
    };
    let mut out = line(header.to_vec());
    out.push('|');
    for w in &widths {
        out.push_str(&"-".repeat(w + 2));
        out.push('|');
    }
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        let s = spread(&[5.0, 5.0, 5.0, 5.0]).unwrap();
        assert!((s.jain - 1.0).abs() < 1e-12);
        assert_eq!((s.min, s.max, s.mean, s.n), (5.0, 5.0, 5.0, 4));
        let s = spread(&[10.0, 0.0, 0.0, 0.0]).unwrap();
        assert!((s.jain - 0.25).abs() < 1e-12);
        assert_eq!((s.min, s.max), (0.0, 10.0));
    }

    #[test]
    fn jain_of_a_known_mix() {
        // (1+2+3)^2 / (3 * (1+4+9)) = 36 / 42
        let s = spread(&[1.0, 2.0, 3.0]).unwrap();
        assert!((s.jain - 36.0 / 42.0).abs() < 1e-12);
    }

    #[test]
    fn empty_or_all_zero_has_no_spread() {
        assert!(spread(&[]).is_none());
        assert!(spread(&[0.0, 0.0]).is_none());
    }

    #[test]
    fn verdicts() {
        let v = Verdict::check(0.6, 0.8, Goal::AtLeast);
        assert!(!v.met);
        assert_eq!(v.describe(), "MISSED: short by 25 %");
        let v = Verdict::check(0.9, 0.8, Goal::AtLeast);
        assert!(v.met);
        assert_eq!(v.describe(), "met");
        let v = Verdict::check(3.1, 1.0, Goal::AtMost);
        assert!(!v.met);
        assert_eq!(v.describe(), "MISSED: 3.10× the bound");
        assert!(Verdict::check(0.5, 1.0, Goal::AtMost).met);
        assert!(!Verdict::check(f64::NAN, 1.0, Goal::AtMost).met);
    }

    #[test]
    fn rate_guards_zero_time() {
        assert_eq!(rate(10.0, 0.0), 0.0);
        assert_eq!(rate(10.0, 2.0), 5.0);
    }
}

/// One target of the issue, checked.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The rule, in words.
    pub rule: String,
    /// The check.
    pub verdict: Verdict,
}

/// `1.23 M`, `456 k`, `789`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "n/a".into()
    } else if a >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0} k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
