//! Injected time.
//!
//! Everything time-dependent in loadgate (overload leases, staleness, queue
//! deadlines, queue-wait histograms) reads a [`Clock`], so tests drive time by
//! hand with [`ManualClock`] and production uses [`MonotonicClock`]. Time is a
//! plain `u64` of nanoseconds since an arbitrary origin, so it can sit in an
//! atomic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;
use std::time::Duration;

/// A source of monotonic time in nanoseconds since an arbitrary origin.
pub trait Clock: Send + Sync + 'static {
    /// Current time in nanoseconds. Never goes backwards (on one thread;
    /// see [`MonotonicClock`] for readings across cores).
    fn now_nanos(&self) -> u64;

    /// Whether the clock follows real time, so that a thread may sleep
    /// until one of its readings. `false` for a clock moved by hand.
    fn real_time(&self) -> bool {
        true
    }

    /// Wakes `waker` each time the clock is moved by hand, so that a
    /// thread waiting for one of its readings looks again (a real-time
    /// clock drops it: sleeping serves).
    fn wake_on_advance(&self, waker: Waker) {
        drop(waker);
    }
}

/// The shared clock handle every loadgate object holds.
pub type SharedClock = Arc<dyn Clock>;

/// The process's monotonic clock: the CPU's time-stamp counter through
/// `quanta` where it is invariant (constant rate, not stopped in sleep
/// states), the operating system's monotonic clock otherwise.
///
/// Reading the counter costs about a third of `Instant::now()` on the
/// x86-64 machines loadgate is measured on (docs/performance.md), and every
/// queued admission reads the clock (its queue-wait time and deadline).
/// The counter is synchronized across cores on invariant-TSC machines; what
/// skew remains is nanoseconds, far below any deadline, lease or staleness
/// window loadgate measures, and a reading earlier than the origin counts as
/// the origin.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: u64,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }

    /// The clock as a [`SharedClock`].
    pub fn shared() -> SharedClock {
        Arc::new(Self::new())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // Saturates after ~584 years of uptime.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A clock that only moves when told to; for tests and simulations. A
/// monitor's maintenance (expiring queue deadlines, marking silent ranks
/// stale) runs when it is moved.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
    /// Woken after every move ([`Clock::wake_on_advance`]).
    wakers: Mutex<Vec<Waker>>,
}

impl ManualClock {
    /// A manual clock at time zero, ready to share.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
        self.moved();
    }

    /// Sets the time to `nanos` if that is not earlier than now.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.fetch_max(nanos, Ordering::SeqCst);
        self.moved();
    }

    fn moved(&self) {
        let wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        wakers.iter().for_each(Waker::wake_by_ref);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }

    fn real_time(&self) -> bool {
        false
    }

    fn wake_on_advance(&self, waker: Waker) {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        wakers.push(waker);
    }
}

/// Converts a duration to nanoseconds, saturating.
#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_follows_real_time_and_never_goes_back() {
        let clock = MonotonicClock::new();
        let wall = std::time::Instant::now();
        let start = clock.now_nanos();
        let mut last = start;
        // Read until the OS clock says 20 ms have passed: the clock must have
        // moved forward about as much (a generous lower bound: the counter's
        // calibration is not exact), never backwards on this thread.
        while wall.elapsed() < Duration::from_millis(20) {
            let now = clock.now_nanos();
            assert!(now >= last, "went back from {last} to {now}");
            last = now;
        }
        // Once more after the loop: a thread descheduled between a read and
        // the wall check would otherwise judge a stale reading.
        let end = clock.now_nanos();
        assert!(end >= last, "went back from {last} to {end}");
        assert!(end - start >= 15_000_000, "moved only {} ns", end - start);
        // Two clocks made at different times share the counter's rate.
        let other = MonotonicClock::shared();
        std::thread::sleep(Duration::from_millis(5));
        assert!(other.now_nanos() >= 4_000_000);
    }
}
