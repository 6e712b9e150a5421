//! Whom to tell when a waiter of the lock-free queue is resolved: the part
//! of each waiter cell (`fifo.rs`) that belongs to the gate.
//!
//! * A future or a blocked thread registers its waker before every check of
//!   its cell's status, and the thread that resolves the cell wakes it
//!   after changing the status (an `AtomicWaker`: no lock). A teller may
//!   come late, after the owner saw its outcome, freed the cell and another
//!   waiter took it: it then wakes the new owner once for nothing, and
//!   takes its registration. So every owner registers again before each
//!   check, never only once.
//! * A callback is *detached*: its owner never looks at the cell. The
//!   callback and the gate handle its permit will hold are stored before
//!   the cell is pushed (the push's `Release` publishes them) and taken by
//!   the one thread that resolves the cell: whoever wins its status change
//!   away from queued (a grant, a rejection, or the ticket's cancel). That
//!   thread then frees the cell.

use std::sync::Arc;
use std::task::{Wake, Waker};

use crate::sync::{current_thread, AtomicWaker, Thread, UnsafeCell};

use super::callback::AdmitCallback;
use super::AdmissionGate;

/// A detached waiter's callback and the gate handle its permit will hold.
pub(super) type Detached = (AdmitCallback, Arc<AdmissionGate>);

/// See the module docs.
#[derive(Default)]
pub(super) struct Tell {
    waker: AtomicWaker,
    callback: UnsafeCell<Option<Detached>>,
}

// SAFETY: `callback` is written only by the enqueuer before the push, and
// taken only by the single thread that won the cell's status change away
// from queued (see the module docs); the status word's Release/Acquire
// orders the two. `AtomicWaker` is Sync itself.
unsafe impl Sync for Tell {}

impl Tell {
    /// Registers the waker to wake when the cell is resolved.
    #[inline]
    pub(super) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// Wakes the registered waker, if any.
    #[inline]
    pub(super) fn wake(&self) {
        self.waker.wake();
    }

    /// Drops the registered waker, if any (a waiter leaving its cell).
    pub(super) fn forget(&self) {
        drop(self.waker.take());
    }

    /// Stores a detached waiter's callback; only before the cell is pushed.
    pub(super) fn set_callback(&self, detached: Detached) {
        // SAFETY: the enqueuer owns the cell until it pushes it (module
        // docs): nobody else reads or writes `callback` now.
        self.callback.with_mut(|c| unsafe { *c = Some(detached) });
    }

    /// Takes a detached waiter's callback; only by the thread that resolved
    /// the cell (or its enqueuer, when the push found a slot waiting).
    pub(super) fn take_callback(&self) -> Option<Detached> {
        // SAFETY: the caller won the cell's status change away from queued
        // (module docs), after the enqueuer's write, which the status word
        // orders before it: nobody else touches `callback`.
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
