//! The queue's measured rates: its drain (every dispatch), for
//! `Retry-After` and an SLO's predicted wait, and each band's accepted
//! arrivals, which go ahead of a less important band's wait; and the
//! wait they predict, with a drain measured outside the queue if given.

use std::time::Duration;

/// Event times kept: at a few hundred dispatches a second, more than the
/// seconds an SLO's wait is predicted over.
const SAMPLES: usize = 256;

/// How many standard deviations low [`wait`] takes the rate left to a
/// request.
const RATE_SPREADS: f64 = 2.0;

/// How many horizons back [`wait`] looks for the drain's longest pause.
const STALL_SPANS: u64 = 4;

/// The wait of a request with `ahead` before it, over `drain` less the
/// rates `overtaking` it, each over the `horizon` nanoseconds before `now`
/// (`FlowQueue::predicted_wait`), or over `freed` less them if that is
/// less: the difference taken [`RATE_SPREADS`] standard deviations low
/// ([`Duration::MAX`] when nothing is left), and no shorter than what
/// remains of the drain's longest pause over [`STALL_SPANS`] horizons.
/// `None` before two dispatches.
pub(super) fn wait(
    ahead: u32,
    drain: &EventRate,
    overtaking: &[EventRate],
    freed: Option<Rate>,
    now: u64,
    horizon: u64,
) -> Option<Duration> {
    let rate = drain.over(now, horizon)?;
    let (mut taken, mut taken_variance) = (0.0, 0.0);
    for r in overtaking.iter().filter_map(|t| t.over(now, horizon)) {
        taken += r.per_second;
        taken_variance += r.variance;
    }
    let left = |r: Rate| r.per_second - taken - RATE_SPREADS * (r.variance + taken_variance).sqrt();
    let free = freed.map_or(left(rate), |f| left(rate).min(left(f)));
    if free <= 0.0 {
        return Some(Duration::MAX);
    }
    let pause = drain.longest_pause(now, STALL_SPANS.saturating_mul(horizon));
    let rest = pause.saturating_sub(now.saturating_sub(drain.newest()));
    let secs = ((f64::from(ahead) + 1.0) / free).max(rest as f64 * 1e-9);
    Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// A measured rate of events.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Events per second.
    pub per_second: f64,
    /// Its variance, events taken as Poisson: the count over the span
    /// squared.
    pub variance: f64,
}

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
    pub(super) fn over(&self, now: u64, horizon: u64) -> Option<Rate> {
        let n = self.count.min(SAMPLES as u64);
        if n < 2 {
            return None;
        }
        let from = now.saturating_sub(horizon);
        let within = (0..n).take_while(|&i| self.nth_newest(i) >= from).count() as u64;
        let (events, span) = if within < n || self.count == n {
            (within, horizon)
        } else {
            (n - 1, now.max(self.newest()) - self.nth_newest(n - 1))
        };
        let secs = span.max(1) as f64 * 1e-9;
        Some(Rate {
            per_second: events as f64 / secs,
            variance: events as f64 / (secs * secs),
        })
    }

    /// The longest quiet between two events in the `within` nanoseconds
    /// before `now` (0 before two events).
    pub(super) fn longest_pause(&self, now: u64, within: u64) -> u64 {
        let n = self.count.min(SAMPLES as u64);
        let from = now.saturating_sub(within);
        (1..n)
            .take_while(|&i| self.nth_newest(i) >= from)
            .map(|i| self.nth_newest(i - 1) - self.nth_newest(i))
            .max()
            .unwrap_or(0)
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
        assert_eq!(r.over(0, S), None);
        let rate = |r: &EventRate, now, horizon| r.over(now, horizon).map(|r| r.per_second);
        // A burst of 10 at 1 s, then nothing.
        for _ in 0..10 {
            r.record(S);
        }
        assert_eq!(r.per_second(), None, "no span yet");
        // Over the second before 1.5 s: the burst, 10 a second.
        assert_eq!(rate(&r, S + S / 2, S), Some(10.0));
        // 10 events in a second: a variance of 10.
        assert_eq!(r.over(S + S / 2, S).unwrap().variance, 10.0);
        // Over the second before 3 s: none.
        assert_eq!(rate(&r, 3 * S, S), Some(0.0));
        // A horizon longer than the ring holds: the ring's span up to now.
        for i in 0..SAMPLES as u64 {
            r.record(2 * S + i * S / 100);
        }
        let newest = 2 * S + (SAMPLES as u64 - 1) * S / 100;
        assert_eq!(r.per_second(), Some(100.0));
        let long = rate(&r, newest, 100 * S).unwrap();
        assert!((long - 100.0).abs() < 1e-9, "{long}");
        let faded = rate(&r, newest + 255 * S / 100, 100 * S).unwrap();
        assert!((faded - 50.0).abs() < 1e-9, "{faded}");
    }

    #[test]
    fn the_longest_pause_is_within_the_look_back() {
        let mut r = EventRate::new();
        assert_eq!(r.longest_pause(S, S), 0, "no events");
        // Bursts at 0 s, 2 s and 3 s.
        for at in [0, 2 * S, 3 * S] {
            for _ in 0..5 {
                r.record(at);
            }
        }
        assert_eq!(r.longest_pause(3 * S + S / 2, 10 * S), 2 * S);
        // Looking back 2 s only sees the 1 s pause.
        assert_eq!(r.longest_pause(3 * S + S / 2, 2 * S), S);
        // A wait is no shorter than what remains of the longest pause:
        // half a second after the last burst, 1.5 s.
        let w = wait(0, &r, &[], None, 3 * S + S / 2, 2 * S).unwrap();
        assert_eq!(w, Duration::from_millis(1500));
    }
}
