//! One place that chooses the synchronization primitives.
//!
//! Normal builds re-export `std`; builds with `--cfg loom` re-export loom's
//! model-checked versions, so every lock-free protocol in this crate runs
//! unchanged under the loom model checker.

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Mutex, MutexGuard,
};

#[cfg(not(loom))]
pub(crate) use std::thread_local;

#[cfg(loom)]
pub(crate) use loom::thread_local;

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Mutex, MutexGuard,
};

/// An `UnsafeCell` whose accesses loom checks for races (std's, unchecked,
/// otherwise).
#[cfg(not(loom))]
#[derive(Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
#[derive(Default)]
pub(crate) struct UnsafeCell<T>(loom::cell::UnsafeCell<T>);

#[cfg(loom)]
impl<T> UnsafeCell<T> {
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        self.0.with_mut(f)
    }
}

/// The current thread's handle, to unpark it.
#[cfg(not(loom))]
pub(crate) use std::thread::{current as current_thread, park, Thread};

#[cfg(loom)]
pub(crate) use loom::thread::{current as current_thread, park, Thread};

/// Starts a thread named `name` running `f`; whether it started. Under
/// loom, a model thread.
#[cfg(not(loom))]
pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> bool {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .is_ok()
}

#[cfg(loom)]
pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> bool {
    let _ = name;
    drop(loom::thread::spawn(f));
    true
}

/// Parks the current thread for at most `dur` (spurious wakeups happen; the
/// caller re-checks). Under loom, parks until unparked.
#[inline]
pub(crate) fn park_timeout(dur: std::time::Duration) {
    #[cfg(not(loom))]
    std::thread::park_timeout(dur);
    #[cfg(loom)]
    {
        let _ = dur;
        loom::thread::park();
    }
}

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
