//! The water level of max-min sharing (`crate::credits`, "Sharing"), kept incrementally: the
//! agents' wants live in two Fenwick trees (binary indexed trees, Fenwick 1994) over the
//! want value — how many agents want each number of frames, and how many frames that is —
//! so a changed want costs O(log W) and the level O(log² W), W the largest want (a ring's
//! window: at most 65,536 frames), whatever the number of agents. Re-levelling follows the
//! agents whose want changed, not all of them.
//!
//! The level is the largest `L` (in 1/2³² frame) with `Σ min(want, L) ≤ capacity`. For `L`
//! in `[k, k + 1)` frames that sum is `S_k(L) = Σ_{want ≤ k} want + L × #{want > k}`; `k`
//! is the largest integer with `S_k(k) ≤ capacity` (S is monotone), found by bisection over
//! the tree's prefix sums, and then `L = (capacity − Σ_{want ≤ k} want) / #{want > k}`.

/// Counts and sums of the wants; see the module documentation.
#[derive(Debug, Default, Clone)]
pub(super) struct Wants {
    /// Fenwick tree of the number of agents per want (index `want + 1`).
    count: Vec<u64>,
    /// Fenwick tree of the frames per want.
    frames: Vec<u64>,
    /// Agents.
    n: u64,
    /// Σ want.
    total: u64,
}

impl Wants {
    /// The tree covers wants `0..size`.
    fn size(&self) -> usize {
        self.count.len().saturating_sub(1)
    }

    fn add(tree: &mut [u64], want: usize, delta: u64) {
        let mut i = want + 1;
        while i < tree.len() {
            tree[i] = tree[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Σ over wants `0..=want` of `tree`.
    fn prefix(tree: &[u64], want: usize) -> u64 {
        let mut i = (want + 1).min(tree.len().saturating_sub(1));
        let mut s = 0u64;
        while i > 0 {
            s = s.wrapping_add(tree[i]);
            i &= i - 1;
        }
        s
    }

    /// Grows the trees to hold `want` (to the next power of two), keeping what they hold.
    fn grow(&mut self, want: usize) {
        if want < self.size() {
            return;
        }
        let size = (want + 1).next_power_of_two().max(64);
        let old = std::mem::take(self);
        self.count = vec![0; size + 1];
        self.frames = vec![0; size + 1];
        for w in 0..old.size() {
            let below = |t: &[u64]| if w == 0 { 0 } else { Self::prefix(t, w - 1) };
            let c = Self::prefix(&old.count, w).wrapping_sub(below(&old.count));
            if c > 0 {
                Self::add(&mut self.count, w, c);
                Self::add(&mut self.frames, w, c.wrapping_mul(w as u64));
            }
        }
        self.n = old.n;
        self.total = old.total;
    }

    /// An agent that wants `want` frames.
    pub(super) fn insert(&mut self, want: u64) {
        let w = usize::try_from(want).unwrap_or(usize::MAX >> 1);
        self.grow(w);
        Self::add(&mut self.count, w, 1);
        Self::add(&mut self.frames, w, want);
        self.n += 1;
        self.total = self.total.saturating_add(want);
    }

    /// An agent that wanted `want` frames is gone (or wants something else now).
    pub(super) fn remove(&mut self, want: u64) {
        let w = usize::try_from(want).unwrap_or(usize::MAX >> 1);
        if self.n == 0 || w >= self.size() {
            return;
        }
        Self::add(&mut self.count, w, 1u64.wrapping_neg());
        Self::add(&mut self.frames, w, want.wrapping_neg());
        self.n -= 1;
        self.total = self.total.saturating_sub(want);
    }

    /// `Σ min(want, k)` for a whole number of frames `k`.
    fn filled(&self, k: usize) -> u128 {
        let below = u128::from(Self::prefix(&self.frames, k));
        let above = u128::from(self.n - Self::prefix(&self.count, k));
        below + above * k as u128
    }

    /// The water level for `capacity` frames, in 1/2³² frame; `u64::MAX` when every want
    /// fits.
    pub(super) fn level(&self, capacity: u64) -> u64 {
        if self.total <= capacity {
            return u64::MAX;
        }
        let cap = u128::from(capacity);
        // filled(lo) ≤ cap < filled(hi): filled(0) = 0, filled(size) = total.
        let (mut lo, mut hi) = (0usize, self.size());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.filled(mid) <= cap {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let rest = cap - u128::from(Self::prefix(&self.frames, lo));
        let above = u128::from(self.n - Self::prefix(&self.count, lo)).max(1);
        u64::try_from((rest << 32) / above).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bisection over every want that `crate::credits` did before (the reference).
    fn brute(wants: &[u64], capacity: u64) -> u64 {
        let cap = u128::from(capacity) << 32;
        let filled = |level: u128| -> u128 {
            wants
                .iter()
                .map(|&w| (u128::from(w) << 32).min(level))
                .sum()
        };
        if filled(u128::MAX) <= cap {
            return u64::MAX;
        }
        let top = wants.iter().copied().max().unwrap_or(0);
        let (mut lo, mut hi) = (0u128, u128::from(top) << 32);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if filled(mid) <= cap {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        u64::try_from(lo).unwrap_or(u64::MAX)
    }

    #[test]
    fn the_incremental_level_is_the_bisection_over_every_want() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut wants: Vec<u64> = Vec::new();
        let mut w = Wants::default();
        for step in 0..3000 {
            match next(3) {
                0 | 1 => {
                    // Wants up to 1,024 frames, now and then one up to 40,000 (tree growth).
                    let v = if next(50) == 0 {
                        next(40_000)
                    } else {
                        1 + next(1024)
                    };
                    wants.push(v);
                    w.insert(v);
                }
                _ if !wants.is_empty() => {
                    let i = usize::try_from(next(wants.len() as u64)).unwrap_or(0);
                    let v = wants.swap_remove(i);
                    w.remove(v);
                }
                _ => {}
            }
            for capacity in [1, 29_127, 3_640, 100 + next(200_000)] {
                assert_eq!(
                    w.level(capacity),
                    brute(&wants, capacity),
                    "step {step}, {} wants, capacity {capacity}",
                    wants.len()
                );
            }
        }
    }
}
