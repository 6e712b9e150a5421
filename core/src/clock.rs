//! Injected time.
//!
//! Everything time-dependent in loadgate (overload leases, staleness, queue
//! deadlines, queue-wait histograms) reads a [`Clock`], so tests drive time by
//! hand with [`ManualClock`] and production uses [`MonotonicClock`]. Time is a
//! plain `u64` of nanoseconds since an arbitrary origin, so it can sit in an
//! atomic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source of monotonic time in nanoseconds since an arbitrary origin.
pub trait Clock: Send + Sync + 'static {
    /// Current time in nanoseconds. Never goes backwards.
    fn now_nanos(&self) -> u64;
}

/// The shared clock handle every loadgate object holds.
pub type SharedClock = Arc<dyn Clock>;

/// The process's monotonic clock (`std::time::Instant`).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
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
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
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
    }

    /// Sets the time to `nanos` if that is not earlier than now.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.fetch_max(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

/// Converts a duration to nanoseconds, saturating.
#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
