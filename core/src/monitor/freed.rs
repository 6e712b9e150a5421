//! The rate at which a model's ranks free room for a request that waits
//! in its queue: its bookings that end.
//!
//! A waiting request is sent when a booking ends (or a report frees a
//! rank), so the rate bookings end at is the drain it will see. The
//! queue's own count of dispatches is not: it also counts the requests
//! sent at once while ranks were free (the fleet filling, the burst of
//! room a report frees), which come at the arrival rate, up to twice the
//! rate at which a full fleet frees room, and alone it promised the first
//! requests to wait half the wait they got. Nor is this rate alone: a
//! rank whose verdict holds it until its predicted times fall reopens
//! later than its bookings end. The queue's prediction takes the lesser
//! of the two (`flow/late.rs`).
//!
//! Each rank counts the bookings that end on it (`RankSlo::released`,
//! beside its count of bookings, in `Booking`'s drop: no line of its
//! own). The maintenance takes those counts once per `FIT_PERIOD` while
//! the model has an SLO (`slo.rs`, `sample_releases`; not each cycle, as
//! the walk is over every rank), keeps the model's running total in a
//! ring ([`Releases`], this file) and publishes the rate over the queue's
//! budget, the count over the span, taken as Poisson for its variance
//! (`ModelSlo::freed`).

use crate::flow::Rate;

/// Samples kept, at least a sampling period apart: about 5 s at the
/// maintenance's 20 ms, and a rate over a longer budget is taken over the
/// ring's span.
const SAMPLES: usize = 256;

/// A model's running total of ended bookings, sampled (module docs).
pub(super) struct Releases {
    /// Clock nanoseconds and the total then, a ring.
    samples: [(u64, u64); SAMPLES],
    /// Samples taken in all.
    count: u64,
    /// Bookings ended, counted since the SLO was set.
    total: u64,
    /// The total at the first sample: those ended before the SLO's
    /// sampling began are no part of a rate.
    first: u64,
}

impl Default for Releases {
    fn default() -> Self {
        Self {
            samples: [(0, 0); SAMPLES],
            count: 0,
            total: 0,
            first: 0,
        }
    }
}

impl Releases {
    /// Starts over (an SLO set where none was).
    pub(super) fn clear(&mut self) {
        self.count = 0;
        self.total = 0;
    }

    /// `n` more bookings ended.
    pub(super) fn add(&mut self, n: u64) {
        self.total += n;
    }

    /// The total at `now` (clock nanoseconds; never before the last): the
    /// newest sample moved to now if it came within `period` nanoseconds
    /// of the one before, else a new one.
    pub(super) fn sample(&mut self, now: u64, period: u64) {
        let replace = self.count >= 2 && self.nth_newest(0).0 - self.nth_newest(1).0 < period;
        if self.count == 0 {
            self.first = self.total;
        }
        if !replace {
            self.count += 1;
        }
        let i = ((self.count - 1) % SAMPLES as u64) as usize;
        self.samples[i] = (now, self.total);
    }

    /// The rate over the `horizon` nanoseconds before the newest sample:
    /// the bookings ended since the newest sample at or before its start,
    /// over the time since; over the horizon itself if it starts before
    /// the first sample (nothing ended before), over the ring's span if
    /// the ring forgot it. `None` before two ended since the first.
    pub(super) fn over(&self, horizon: u64) -> Option<Rate> {
        let held = self.count.min(SAMPLES as u64);
        if held == 0 {
            return None;
        }
        let (now, total) = self.nth_newest(0);
        if total - self.first < 2 {
            return None;
        }
        let oldest = self.nth_newest(held - 1);
        let from = now.saturating_sub(horizon);
        let (ended, span) = match (0..held).map(|i| self.nth_newest(i)).find(|s| s.0 <= from) {
            Some((at, then)) => (total - then, now - at),
            None if self.count <= SAMPLES as u64 => (total - oldest.1, horizon),
            None => (total - oldest.1, now - oldest.0),
        };
        let secs = span.max(1) as f64 * 1e-9;
        Some(Rate {
            per_second: ended as f64 / secs,
            variance: ended as f64 / (secs * secs),
        })
    }

    fn nth_newest(&self, i: u64) -> (u64, u64) {
        self.samples[((self.count - 1 - i) % SAMPLES as u64) as usize]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;
    /// The maintenance's period.
    const PERIOD: u64 = 20 * MS;

    fn rate(r: &Releases, horizon: u64) -> Option<f64> {
        r.over(horizon).map(|r| r.per_second)
    }

    #[test]
    fn the_rate_counts_what_ended_over_the_horizon_and_fades() {
        // Seven ended before the SLO was set: not counted.
        let mut r = Releases {
            total: 7,
            ..Default::default()
        };
        r.sample(S, PERIOD);
        assert_eq!(r.over(S), None, "none ended since");
        // From 1 s, one ended every 10 ms for a second, sampled every 10 ms: samples
        // kept 20 ms apart, the newest always now.
        for i in 1..=100 {
            r.total += 1;
            r.sample(S + i * 10 * MS, PERIOD);
        }
        assert_eq!(r.count, 51, "one per 20 ms, and the first");
        assert_eq!(rate(&r, S), Some(100.0));
        assert_eq!(r.over(S).unwrap().variance, 100.0);
        // Over half a second: the 50 since the sample at 1.5 s.
        assert_eq!(rate(&r, S / 2), Some(100.0));
        // A horizon before the first sample: over the horizon itself.
        assert_eq!(rate(&r, 2 * S), Some(50.0));
        // Nothing ends for 0.5 s: the rate over the last second halves.
        r.sample(2 * S + S / 2, PERIOD);
        assert_eq!(rate(&r, S), Some(50.0));
    }

    #[test]
    fn a_forgotten_horizon_is_taken_over_the_rings_span() {
        let mut r = Releases::default();
        for i in 0..2 * SAMPLES as u64 {
            r.sample(i * 20 * MS, PERIOD);
            r.total += 2;
        }
        r.sample(2 * SAMPLES as u64 * 20 * MS, PERIOD);
        // 100 a second throughout; the ring holds 5.1 s of it.
        let long = rate(&r, 60 * S).unwrap();
        assert!((long - 100.0).abs() < 1e-9, "{long}");
        r.clear();
        assert_eq!(r.over(S), None, "cleared");
    }
}
