//! The wake list: waiters resolved under the gate's mutex, told (task woken,
//! condition variable notified, callback called) only after it is released.

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::task::Waker;

use super::callback::{dispatch, AdmitCallback};
use super::error::AdmitError;
use super::permit::OwnedPermit;
use super::raw::RawGate;
use super::AdmissionGate;

/// One waiter to tell after the lock is released.
pub(super) enum Wake {
    /// Wake a task.
    Task(Waker),
    /// Drop what a cancelled cell held (its waker or callback), outside the
    /// lock: a drop may run user code.
    Discard(super::table::Waiter),
    /// Notify the condition variable with this index.
    Thread(usize),
    /// Call a callback.
    Callback {
        /// The callback.
        callback: AdmitCallback,
        /// The gate handle for its permit.
        gate: Arc<AdmissionGate>,
        /// Granted or rejected.
        outcome: Result<(), AdmitError>,
    },
}

/// Most waiters resolved under one hold of the lock; an operation that
/// resolves more (a close with a long queue) takes the lock again per batch.
pub(super) const WAKE_BATCH: usize = 32;

/// Waiters resolved under the lock, told after it is released. Fixed size,
/// on the stack: resolving waiters allocates nothing, and an empty list costs
/// nothing to build or drop (its slots are not initialized until pushed), which
/// matters because every queued admission and slow release builds one.
pub(super) struct WakeList {
    /// Slots `told..len` hold waiters not yet told; the rest are
    /// uninitialized.
    items: [MaybeUninit<Wake>; WAKE_BATCH],
    told: usize,
    len: usize,
}

impl WakeList {
    pub(super) fn new() -> Self {
        Self {
            items: [const { MaybeUninit::uninit() }; WAKE_BATCH],
            told: 0,
            len: 0,
        }
    }

    pub(super) fn is_full(&self) -> bool {
        self.len == WAKE_BATCH
    }

    /// How many more waiters fit.
    pub(super) fn room(&self) -> usize {
        WAKE_BATCH - self.len
    }

    /// Adds a waiter to tell. Panics (bounds check) if the list is full:
    /// callers check [`is_full`](Self::is_full) or [`room`](Self::room).
    pub(super) fn push(&mut self, wake: Wake) {
        self.items[self.len].write(wake);
        self.len += 1;
    }

    /// Tells every waiter, in the order they were resolved, and leaves the
    /// list empty for the next batch. Call only after the gate's lock is
    /// released: callbacks and wakers run user code.
    pub(super) fn run(&mut self, gate: &RawGate) {
        while self.told < self.len {
            let i = self.told;
            self.told += 1;
            // SAFETY: slots `told..len` are initialized (written by `push`,
            // not yet read); advancing `told` first makes this read the slot's
            // only owner, so neither a later `run` nor `drop` reads it again,
            // even if the waker or callback below panics.
            let wake = unsafe { self.items[i].assume_init_read() };
            match wake {
                Wake::Task(waker) => waker.wake(),
                Wake::Discard(waiter) => drop(waiter),
                Wake::Thread(cv) => gate.notify_thread(cv),
                Wake::Callback {
                    callback,
                    gate,
                    outcome,
                } => {
                    dispatch(callback, outcome.map(|()| OwnedPermit::new(gate)));
                }
            }
        }
        self.told = 0;
        self.len = 0;
    }
}

impl Drop for WakeList {
    /// Drops waiters never told (only if `run` was not reached, e.g. a panic
    /// between resolving and telling).
    fn drop(&mut self) {
        for slot in &mut self.items[self.told..self.len] {
            // SAFETY: slots `told..len` are initialized and owned by the list.
            unsafe { slot.assume_init_drop() };
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::gate::GateConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake as TaskWake;

    /// Counts wakes; its `Arc` count tells how many wakers are alive.
    struct Counting(AtomicUsize);

    impl TaskWake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_wake_list_tells_each_waiter_once_and_can_be_refilled() {
        let gate = AdmissionGate::new(GateConfig::new(1)).unwrap();
        let counter = Arc::new(Counting(AtomicUsize::new(0)));
        let mut wakes = WakeList::new();
        for _ in 0..WAKE_BATCH {
            wakes.push(Wake::Task(Waker::from(Arc::clone(&counter))));
        }
        assert!(wakes.is_full());
        wakes.run(&gate.raw);
        assert_eq!(counter.0.load(Ordering::Relaxed), WAKE_BATCH);
        assert_eq!(Arc::strong_count(&counter), 1, "every waker consumed");
        assert_eq!(wakes.room(), WAKE_BATCH);
        wakes.push(Wake::Task(Waker::from(Arc::clone(&counter))));
        wakes.run(&gate.raw);
        wakes.run(&gate.raw);
        assert_eq!(counter.0.load(Ordering::Relaxed), WAKE_BATCH + 1);
    }

    #[test]
    fn a_wake_list_dropped_before_running_drops_its_waiters_untold() {
        let counter = Arc::new(Counting(AtomicUsize::new(0)));
        let mut wakes = WakeList::new();
        for _ in 0..3 {
            wakes.push(Wake::Task(Waker::from(Arc::clone(&counter))));
        }
        assert_eq!(Arc::strong_count(&counter), 4);
        drop(wakes);
        assert_eq!(Arc::strong_count(&counter), 1, "no waker leaked");
        assert_eq!(counter.0.load(Ordering::Relaxed), 0, "nobody told");
    }
}
