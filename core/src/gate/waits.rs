//! The queue-wait histogram: one counter for each bucket the metrics render,
//! plus the sum, each a `Relaxed` atomic, so that whoever grants a waiter
//! records its wait without a lock. Plain `std` atomics: statistics that
//! order nothing, outside what the model checker explores.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds, in seconds, of the histogram's buckets.
pub(super) const BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The bounds in nanoseconds.
const BOUNDS_NANOS: [u64; 16] = {
    let mut b = [0; 16];
    let mut i = 0;
    while i < 16 {
        b[i] = (BUCKETS[i] * 1e9) as u64;
        i += 1;
    }
    b
};

/// See the module docs.
pub(super) struct Waits {
    /// Waits in each bucket alone (not cumulative); the last past every
    /// bound.
    counts: [AtomicU64; 17],
    sum_nanos: AtomicU64,
}

/// A histogram read: cumulative counts up to each bound, the total and the
/// sum in nanoseconds.
pub(super) struct WaitsRead {
    pub(super) cumulative: [u64; 16],
    pub(super) total: u64,
    pub(super) sum_nanos: u64,
}

impl Waits {
    pub(super) fn new() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one wait of `nanos`.
    #[inline]
    pub(super) fn record(&self, nanos: u64) {
        let bucket = BOUNDS_NANOS.partition_point(|&b| b < nanos);
        // Relaxed: statistics (see the module docs).
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The histogram now (the buckets read one by one while others may
    /// record: each count is exact, the set a moment's spread).
    pub(super) fn read(&self) -> WaitsRead {
        let mut cumulative = [0; 16];
        let mut total = 0;
        for (k, count) in self.counts.iter().enumerate() {
            // Relaxed: statistics.
            total += count.load(Ordering::Relaxed);
            if k < 16 {
                cumulative[k] = total;
            }
        }
        WaitsRead {
            cumulative,
            total,
            // Relaxed: statistics.
            sum_nanos: self.sum_nanos.load(Ordering::Relaxed),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_wait_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        let w = Waits::new();
        w.record(0);
        w.record(500_000); // exactly 0.5 ms: the first bucket (le=0.0005)
        w.record(500_001);
        w.record(61_000_000_000); // past every bound: +Inf only
        let r = w.read();
        assert_eq!(r.cumulative[0], 2);
        assert_eq!(r.cumulative[1], 3);
        assert_eq!(r.cumulative[15], 3);
        assert_eq!(r.total, 4);
        assert_eq!(r.sum_nanos, 61_001_000_001);
    }
}
