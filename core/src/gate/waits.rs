//! The queue-wait histogram: one counter for each bucket the metrics render,
//! plus the sum, in per-thread cells (`counter.rs`), so that whoever grants
//! a waiter records its wait without a lock or a locked instruction. Plain
//! `std` atomics: statistics that order nothing, outside what the model
//! checker explores.

use crate::counter::ThreadCounters;
use crate::metrics::WAIT_BUCKETS as BUCKETS;

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

/// Where the sum sits beside the 17 buckets.
const SUM: usize = 17;

/// See the module docs.
pub(super) struct Waits {
    /// Waits in each bucket alone (not cumulative; the last past every
    /// bound), then the sum in nanoseconds.
    counts: ThreadCounters<18>,
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
            counts: ThreadCounters::new(),
        }
    }

    /// Records one wait of `nanos`.
    #[inline]
    pub(super) fn record(&self, nanos: u64) {
        let bucket = BOUNDS_NANOS.partition_point(|&b| b < nanos);
        self.counts.add(&[(bucket, 1), (SUM, nanos)]);
    }

    /// The histogram now (the buckets read one by one while others may
    /// record: each count is exact at rest, the set a moment's spread).
    pub(super) fn read(&self) -> WaitsRead {
        let mut cumulative = [0; 16];
        let mut total = 0;
        for (k, up_to) in cumulative.iter_mut().enumerate() {
            total += self.counts.get(k);
            *up_to = total;
        }
        // The last bucket, past every bound.
        total += self.counts.get(16);
        WaitsRead {
            cumulative,
            total,
            sum_nanos: self.counts.get(SUM),
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
