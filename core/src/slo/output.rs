//! [`OutputLengths`]: a model's answers' lengths, learned online in fixed
//! memory, for reserving the KV an answer will still need.
//!
//! # Why the expected total, not a quantile
//!
//! A rank's cache is shared by many answers at once. What exhausts it is
//! the sum of what they will still grow, and the expected value of a sum
//! is the sum of the expected values: reserving for each answer the mean
//! of what answers of its length so far go on to reach keeps the sum
//! right, where a high quantile per answer would reserve several times
//! the cache a fleet ever uses, and a median too little for heavy tails.
//! So the table this keeps is, for an answer that has produced `g`
//! tokens, the mean total length of the answers that reached at least
//! `g`'s bucket: `E[L | L ≥ bucket(g)]`, which grows as the answer does.
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

    /// For each bucket `b`, the mean length of the answers in buckets `b`
    /// and up, rounded (module docs); a bucket past every answer seen
    /// holds its own lower bound. All zero until [`trusted`](Self::trusted).
    pub fn expected_totals(&self) -> [u64; BUCKETS] {
        let mut out = [0u64; BUCKETS];
        if !self.trusted() {
            return out;
        }
        let (mut count, mut sum) = (0.0, 0.0);
        for b in (0..BUCKETS).rev() {
            count += self.count[b];
            sum += self.sum[b];
            out[b] = if count > 1e-9 {
                (sum / count).round() as u64
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
        assert_eq!(t.expected_totals(), [0; BUCKETS]);
        t.observe(100);
        assert_eq!(t.expected_totals()[bucket(1)], 100);
    }

    #[test]
    fn the_expected_total_grows_with_what_was_produced() {
        let mut t = OutputLengths::new();
        // Half the answers 100 tokens, half 2,000.
        for i in 0..400 {
            t.observe(if i % 2 == 0 { 100 } else { 2000 });
        }
        let e = t.expected_totals();
        // At the start: the mean, 1,050.
        assert!((1000..=1100).contains(&e[bucket(1)]), "{}", e[bucket(1)]);
        // Past 100 tokens only the long ones remain.
        assert_eq!(e[bucket(500)], 2000);
        // Past every answer seen: its own bucket's bound, at most what was
        // produced.
        assert!(e[bucket(10_000)] <= 10_000);
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
        let e = t.expected_totals()[bucket(1)];
        assert!((1400..=1500).contains(&e), "{e}");
    }
}
