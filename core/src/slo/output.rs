//! [`OutputLengths`]: a model's answers' lengths, learned online in fixed
//! memory, for reserving the KV an answer will still need.
//!
//! # Why the expected peak, not the expected total or a quantile
//!
//! A rank's cache is shared by many answers at once, and what exhausts it
//! is what they hold *together at one moment*. An answer that has produced
//! `g` tokens holds `x` of them later only if it lives that long, so what
//! it is expected to hold once it has `x` is `x · P(L ≥ x | L ≥ g)`, and the
//! most it is expected to hold at any one later moment is the peak of that
//! over `x ≥ g`. The expected usage of a set of answers at any moment is
//! the sum of what each is expected to hold then, which is at most the sum
//! of their peaks: reserving each answer's peak keeps the expected usage of
//! what was admitted under what is reserved at every later moment, with
//! nothing admitted after. The expected *total* (`E[L | L ≥ g]`) reserves
//! more: it counts every answer at its final length at once, though the
//! short ones end and free their blocks while the long ones grow (on the
//! lab's chat workload, prompts included, 1.17 times the KV its running
//! requests hold in a steady state, 1.58 times with reasoning-length
//! answers, where the peak reserves 1.02 and 1.06 times); a high quantile
//! per answer reserves several times more still, and a median too little
//! for heavy tails. So the table this keeps is, for an answer that has
//! produced `g` tokens, that peak, which grows as the answer does and is
//! never less than `g`'s bucket.
//!
//! # Memory and forgetting
//!
//! [`BUCKETS`] log-spaced buckets (four per doubling, up to
//! [`MAX_OUTPUT`] tokens), each a decayed count and a decayed sum of
//! lengths: every observation multiplies all of them by
//! [`FORGETTING`], so the table follows a workload that changes within a
//! few hundred answers. An observation over [`MAX_OUTPUT`] counts as
//! [`MAX_OUTPUT`]; nothing is allocated after construction.

/// Buckets in the table: four per doubling of the length.
pub const BUCKETS: usize = 4 * 20;
/// Longest output the table tells apart (about a million tokens); longer
/// ones count as this.
pub const MAX_OUTPUT: u64 = 1 << 20;
/// Weight each older observation keeps per new one.
pub const FORGETTING: f64 = 0.995;
/// Answers observed before the table is used.
pub const MIN_OUTPUTS: u64 = 32;

/// The bucket of an answer of `tokens` tokens: four per doubling.
pub fn bucket(tokens: u64) -> usize {
    let n = tokens.clamp(1, MAX_OUTPUT);
    let log = 63 - n.leading_zeros() as usize;
    // The two bits after the leading one pick the quarter of the doubling.
    let quarter = if log >= 2 {
        (n >> (log - 2)) as usize & 3
    } else {
        (n << (2 - log)) as usize & 3
    };
    (log * 4 + quarter).min(BUCKETS - 1)
}

/// A model's output lengths (module docs).
#[derive(Debug, Clone)]
pub struct OutputLengths {
    count: [f64; BUCKETS],
    sum: [f64; BUCKETS],
    observed: u64,
}

impl Default for OutputLengths {
    fn default() -> Self {
        Self::new()
    }
}

impl OutputLengths {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            count: [0.0; BUCKETS],
            sum: [0.0; BUCKETS],
            observed: 0,
        }
    }

    /// An answer of `tokens` tokens ended. Zero-token answers (cancelled
    /// before their first token) say nothing about lengths and are
    /// ignored.
    pub fn observe(&mut self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        for (c, s) in self.count.iter_mut().zip(self.sum.iter_mut()) {
            *c *= FORGETTING;
            *s *= FORGETTING;
        }
        let tokens = tokens.min(MAX_OUTPUT);
        let b = bucket(tokens);
        self.count[b] += 1.0;
        self.sum[b] += tokens as f64;
        self.observed = self.observed.saturating_add(1);
    }

    /// Answers observed.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// Whether enough answers were observed for the table to be used.
    pub fn trusted(&self) -> bool {
        self.observed >= MIN_OUTPUTS
    }

    /// For each bucket `b`, the most an answer that reached it is expected
    /// to hold at any one later moment (module docs): the peak over the
    /// buckets `j ≥ b` of `x̄ⱼ · Nⱼ / N_b`, where `x̄ⱼ` is the mean length of
    /// the answers in bucket `j` and `Nⱼ` the answers in buckets `j` and up
    /// (counting every answer of bucket `j` as reaching its mean, a little
    /// more than it holds); rounded. A bucket past every answer seen holds
    /// its own lower bound. All zero until [`trusted`](Self::trusted).
    pub fn expected_peaks(&self) -> [u64; BUCKETS] {
        let mut out = [0u64; BUCKETS];
        if !self.trusted() {
            return out;
        }
        // `reaching`: Nⱼ; `peak`: the largest x̄ⱼ · Nⱼ from here up.
        let (mut reaching, mut peak) = (0.0f64, 0.0f64);
        for b in (0..BUCKETS).rev() {
            reaching += self.count[b];
            if self.count[b] > 1e-9 {
                peak = peak.max(self.sum[b] / self.count[b] * reaching);
            }
            out[b] = if reaching > 1e-9 {
                ((peak / reaching).round() as u64).max(lower_bound(b))
            } else {
                lower_bound(b)
            };
        }
        out
    }
}

/// The shortest length in bucket `b`.
fn lower_bound(b: usize) -> u64 {
    let (log, quarter) = (b / 4, (b % 4) as u64);
    if log >= 2 {
        (1u64 << log) + (quarter << (log - 2))
    } else {
        // Lengths 1 to 3 have buckets 0, 4 and 6.
        (1u64 << log) + (quarter >> (2 - log))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_bounded() {
        let mut last = 0;
        for n in 1..5000u64 {
            let b = bucket(n);
            assert!(b >= last, "bucket({n}) = {b} < {last}");
            assert!(lower_bound(b) <= n, "lower_bound({b}) > {n}");
            last = b;
        }
        assert_eq!(bucket(0), bucket(1));
        assert_eq!(bucket(u64::MAX), bucket(MAX_OUTPUT));
        assert!(bucket(MAX_OUTPUT) < BUCKETS);
    }

    #[test]
    fn nothing_is_reserved_before_enough_answers() {
        let mut t = OutputLengths::new();
        for _ in 0..MIN_OUTPUTS - 1 {
            t.observe(100);
        }
        assert_eq!(t.expected_peaks(), [0; BUCKETS]);
        t.observe(100);
        assert_eq!(t.expected_peaks()[bucket(1)], 100);
    }

    #[test]
    fn the_peak_grows_with_what_was_produced() {
        let mut t = OutputLengths::new();
        // Half the answers 100 tokens, half 2,000.
        for i in 0..400 {
            t.observe(if i % 2 == 0 { 100 } else { 2000 });
        }
        let e = t.expected_peaks();
        // At the start: half of them reach 2,000 (the expected total, 1,050,
        // counts the short ones' blocks as held while the long ones grow).
        assert!((950..=1050).contains(&e[bucket(1)]), "{}", e[bucket(1)]);
        // Past 100 tokens only the long ones remain.
        assert_eq!(e[bucket(500)], 2000);
        // Past every answer seen: its own bucket's bound, at most what was
        // produced.
        assert!(e[bucket(10_000)] <= 10_000);
        assert!(e[bucket(10_000)] >= lower_bound(bucket(10_000)));
    }

    /// Lengths of a heavy-tailed workload (lognormal, median 200, σ 0.7, at
    /// most 8,192) from a fixed seed.
    fn lognormal_lengths(n: usize) -> Vec<u64> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let normal =
                    (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
                (200.0 * (0.7 * normal).exp()).clamp(1.0, 8192.0) as u64
            })
            .collect()
    }

    #[test]
    fn the_peak_is_what_the_answers_are_expected_to_hold_at_most_and_not_their_total() {
        let lengths = lognormal_lengths(3000);
        let mut t = OutputLengths::new();
        for &l in &lengths {
            t.observe(l);
        }
        let peaks = t.expected_peaks();
        // The table's weights: each answer forgotten by `FORGETTING` per
        // later one.
        let n = lengths.len();
        let weight = |i: usize| FORGETTING.powi((n - 1 - i) as i32);
        let reaching = |x: u64| -> f64 { (0..n).filter(|&i| lengths[i] >= x).map(weight).sum() };
        for g in [1u64, 50, 100, 200, 400, 800, 1600] {
            let b = bucket(g);
            let from = lower_bound(b);
            let base = reaching(from);
            // What an answer that reached `from` is expected to hold once it
            // has `x`, at its largest over the lengths seen.
            let peak = lengths
                .iter()
                .filter(|&&x| x >= from)
                .map(|&x| x as f64 * reaching(x) / base)
                .fold(0.0, f64::max);
            let total = (0..n)
                .filter(|&i| lengths[i] >= from)
                .map(|i| weight(i) * lengths[i] as f64)
                .sum::<f64>()
                / base;
            let p = peaks[b] as f64;
            // Within the width of a bucket (a quarter of a doubling) of the
            // peak, and never over the expected total (but for rounding).
            assert!(p >= peak / 1.19, "g {g}: {p} under the peak {peak}");
            assert!(p <= peak * 1.19, "g {g}: {p} over the peak {peak}");
            assert!(p <= total + 1.0, "g {g}: {p} over the total {total}");
        }
        // A new answer reserves under half its expected total here.
        let new = peaks[bucket(1)] as f64;
        let mean = lengths.iter().sum::<u64>() as f64 / n as f64;
        assert!(new < 0.5 * mean, "{new} against a mean of {mean}");
    }

    #[test]
    fn it_follows_a_workload_that_changes() {
        let mut t = OutputLengths::new();
        for _ in 0..1000 {
            t.observe(200);
        }
        for _ in 0..1000 {
            t.observe(1500);
        }
        let e = t.expected_peaks()[bucket(1)];
        assert!((1400..=1500).contains(&e), "{e}");
    }
}
