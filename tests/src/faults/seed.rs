//! The row's seed: a small seeded generator and the seed of each row (`UCTEL_FAULT_SEED`
//! overrides it), which drives the fault injector, the line padding and the burst sizes.

/// A small seeded generator (SplitMix64): the tests crate takes no RNG dependency, and the
/// same seed must give the same row on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

/// One SplitMix64 step of `z` (also a good 64-bit mixer).
pub fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The seed of row `row`: `UCTEL_FAULT_SEED` (decimal or `0x` hex) when set, otherwise a hash
/// of the row name, so every run of a row is the same run unless asked otherwise. Kept below
/// 2^48 so YAML, JSON and logs carry it exactly.
pub fn row_seed(row: &str) -> u64 {
    if let Ok(v) = std::env::var("UCTEL_FAULT_SEED") {
        let v = v.trim();
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        };
        if let Some(s) = parsed {
            return s & 0xFFFF_FFFF_FFFF;
        }
    }
    // FNV-1a.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in row.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h) & 0xFFFF_FFFF_FFFF
}
