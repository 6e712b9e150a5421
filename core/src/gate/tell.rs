//! What a detached waiter of the lock-free queue leaves in its cell: the
//! part of each waiter cell (`fifo.rs`) that belongs to the gate, and the
//! waker a blocked thread leaves in its cell.
//!
//! A callback is *detached*: its owner never looks at the cell. What it
//! needs (a [`Detached`]: in the public layer, the callback and the gate
//! handle its permit will hold, `callback.rs`) is stored before the cell is
//! pushed (the push's `Release` publishes it), or before its owner arms a
//! cell pushed with nobody to tell yet (the arm's `Release` sets the
//! detached flag), and taken by the one thread that resolves the detached
//! cell: whoever wins its status change away from queued (a grant, a
//! rejection, or the ticket's cancel). That thread then frees the cell and
//! tells it. (A future's or a blocked thread's waker lives in the
//! queue's own part of the cell: `fifo/owner.rs`, "Wakers".)

use std::sync::Arc;
use std::task::{Wake, Waker};

use crate::sync::{current_thread, Thread, UnsafeCell};

use super::error::AdmitError;

/// What a detached waiter leaves in its cell (module docs).
pub(super) trait Detached: Send + 'static {
    /// Tells the waiter its outcome; called once, by the thread that
    /// resolved the cell, after it freed the cell.
    fn resolve(self, outcome: Result<(), AdmitError>);
}

/// See the module docs.
pub(super) struct Tell<D> {
    callback: UnsafeCell<Option<D>>,
}

impl<D> Default for Tell<D> {
    fn default() -> Self {
        Self {
            callback: UnsafeCell::default(),
        }
    }
}

// SAFETY: `callback` is written only by the enqueuer before the push, and
// taken only by the single thread that won the cell's status change away
// from queued (see the module docs); the status word's Release/Acquire
// orders the two, and `D: Send` lets it move between them.
unsafe impl<D: Send> Sync for Tell<D> {}

impl<D> Tell<D> {
    /// Stores a detached waiter's callback; only while the cell is not
    /// detached yet: before its push, or before its owner arms it.
    pub(super) fn set_callback(&self, detached: D) {
        // SAFETY: until the cell's status word says detached, no resolver
        // touches `callback` (module docs): its owner alone reads or writes
        // it now.
        self.callback.with_mut(|c| unsafe { *c = Some(detached) });
    }

    /// Takes a detached waiter's callback; only by the thread that resolved
    /// the cell, or its owner while the cell is not detached (a push that
    /// found a slot waiting, an arm that found the cell resolved).
    pub(super) fn take_callback(&self) -> Option<D> {
        // SAFETY: the caller won the cell's status change away from queued
        // from a detached word (module docs), after the owner's write, which
        // the status word orders before it; or it is the owner of a cell no
        // resolver will look into: nobody else touches `callback`.
        self.callback.with_mut(|c| unsafe { (*c).take() })
    }
}

/// Unparks a thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

crate::sync::thread_local! {
    /// This thread's waker for blocking waits, made on its first one.
    static THREAD_WAKER: Waker = Waker::from(Arc::new(Unpark(current_thread())));
}

/// Runs `f` with a waker that unparks the current thread.
pub(super) fn with_thread_waker<R>(f: impl FnOnce(&Waker) -> R) -> R {
    THREAD_WAKER.with(f)
}
