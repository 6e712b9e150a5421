//! One place that chooses the synchronization primitives.
//!
//! Normal builds re-export `std`; builds with `--cfg loom` re-export loom's
//! model-checked versions, so every lock-free protocol in this crate runs
//! unchanged under the loom model checker.

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard,
};

#[cfg(not(loom))]
pub(crate) use std::thread_local;

#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard,
};

/// Hint used inside short wait loops (spin once, then let the scheduler run).
#[inline]
pub(crate) fn spin_wait() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Locks a mutex, ignoring poisoning: every critical section in this crate
/// leaves the protected data consistent before it can panic.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
}

/// Waits on a condition variable, ignoring poisoning (see [`lock`]).
#[inline]
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    #[cfg(not(loom))]
    {
        cv.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(loom)]
    {
        cv.wait(guard).unwrap()
    }
}

/// Waits on a condition variable for at most `dur`, ignoring poisoning. The
/// caller re-checks its condition and its clock; under loom the wait never
/// times out.
#[inline]
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    dur: std::time::Duration,
) -> MutexGuard<'a, T> {
    #[cfg(not(loom))]
    {
        cv.wait_timeout(guard, dur)
            .map_or_else(|e| e.into_inner().0, |(g, _)| g)
    }
    #[cfg(loom)]
    {
        cv.wait_timeout(guard, dur).unwrap().0
    }
}
