//! The queue's measured rates: its drain (every dispatch), for
//! `Retry-After` and an SLO's predicted wait, and each band's accepted
//! arrivals, which go ahead of a less important band's wait.

/// Event times kept: at a few hundred dispatches a second, more than the
/// seconds an SLO's wait is predicted over.
const SAMPLES: usize = 256;

/// The times of the last [`SAMPLES`] events, in a ring.
pub(super) struct EventRate {
    at: [u64; SAMPLES],
    /// Events recorded in all.
    count: u64,
}

impl EventRate {
    pub(super) fn new() -> Self {
        Self {
            at: [0; SAMPLES],
            count: 0,
        }
    }

    /// An event at `now` (clock nanoseconds; never before the last).
    pub(super) fn record(&mut self, now: u64) {
        self.at[(self.count % SAMPLES as u64) as usize] = now;
        self.count += 1;
    }

    /// Events per second over the recorded window; `None` before two
    /// events at different times.
    pub(super) fn per_second(&self) -> Option<f64> {
        let n = self.count.min(SAMPLES as u64);
        if n < 2 {
            return None;
        }
        let span = self.newest() - self.nth_newest(n - 1);
        (span > 0).then(|| (n - 1) as f64 * 1e9 / span as f64)
    }

    /// Events per second over the `horizon` nanoseconds before `now`:
    /// those in it over its length, so a rate fades while nothing
    /// happens; over the ring's span up to `now` if the ring has
    /// forgotten events of the horizon. `None` before two events.
    pub(super) fn per_second_over(&self, now: u64, horizon: u64) -> Option<f64> {
        let n = self.count.min(SAMPLES as u64);
        if n < 2 {
            return None;
        }
        let from = now.saturating_sub(horizon);
        let within = (0..n).take_while(|&i| self.nth_newest(i) >= from).count() as u64;
        if within < n || self.count == n {
            return Some(within as f64 * 1e9 / horizon.max(1) as f64);
        }
        let span = now.max(self.newest()) - self.nth_newest(n - 1);
        Some((n - 1) as f64 * 1e9 / span.max(1) as f64)
    }

    fn newest(&self) -> u64 {
        self.nth_newest(0)
    }

    /// The time of the `i`-th newest event (`i` below the events held).
    fn nth_newest(&self, i: u64) -> u64 {
        self.at[((self.count - 1 - i) % SAMPLES as u64) as usize]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_rate_over_a_horizon_counts_what_fell_in_it_and_fades() {
        let mut r = EventRate::new();
        assert_eq!(r.per_second_over(0, S), None);
        // A burst of 10 at 1 s, then nothing.
        for _ in 0..10 {
            r.record(S);
        }
        assert_eq!(r.per_second(), None, "no span yet");
        // Over the second before 1.5 s: the burst, 10 a second.
        assert_eq!(r.per_second_over(S + S / 2, S), Some(10.0));
        // Over the second before 3 s: none.
        assert_eq!(r.per_second_over(3 * S, S), Some(0.0));
        // A horizon longer than the ring holds: the ring's span up to now.
        for i in 0..SAMPLES as u64 {
            r.record(2 * S + i * S / 100);
        }
        let newest = 2 * S + (SAMPLES as u64 - 1) * S / 100;
        assert_eq!(r.per_second(), Some(100.0));
        let long = r.per_second_over(newest, 100 * S).unwrap();
        assert!((long - 100.0).abs() < 1e-9, "{long}");
        let faded = r.per_second_over(newest + 255 * S / 100, 100 * S).unwrap();
        assert!((faded - 50.0).abs() < 1e-9, "{faded}");
    }
}
