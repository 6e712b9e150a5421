//! The queue's measured drain rate, for `Retry-After`.

/// Dispatch times kept.
const SAMPLES: usize = 32;

/// The times of the last [`SAMPLES`] dispatches, in a ring.
pub(super) struct DrainRate {
    at: [u64; SAMPLES],
    /// Dispatches recorded in all.
    count: u64,
}

impl DrainRate {
    pub(super) fn new() -> Self {
        Self {
            at: [0; SAMPLES],
            count: 0,
        }
    }

    /// A dispatch at `now` (clock nanoseconds).
    pub(super) fn record(&mut self, now: u64) {
        self.at[(self.count % SAMPLES as u64) as usize] = now;
        self.count += 1;
    }

    /// Dispatches per second over the recorded window; `None` before two
    /// dispatches at different times.
    pub(super) fn per_second(&self) -> Option<f64> {
        let n = self.count.min(SAMPLES as u64);
        if n < 2 {
            return None;
        }
        let newest = self.at[((self.count - 1) % SAMPLES as u64) as usize];
        let oldest = self.at[((self.count - n) % SAMPLES as u64) as usize];
        let span = newest.checked_sub(oldest).filter(|&s| s > 0)?;
        Some((n - 1) as f64 * 1e9 / span as f64)
    }
}
