//! A small deterministic generator (splitmix64) for simulations, so that a
//! failing case replays from its seed.
#![allow(dead_code)] // not every including binary simulates

/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0; the modulo's bias is negligible here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `p / per`.
    pub fn chance(&mut self, per: u64, p: u32) -> bool {
        self.below(per) < u64::from(p)
    }
}
