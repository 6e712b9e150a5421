//! The callback form of admission: [`AdmitCallback`], the
//! [`CallbackTicket`] that can cancel a queued request, and the per-thread
//! trampoline that calls callbacks without recursing.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::error::AdmitError;
use super::permit::OwnedPermit;
use super::queue::{Enqueued, Waiter};
use super::raw::Fast;
use super::tell::Detached;
use super::AdmissionGate;

/// The callback form's callback: called exactly once, with a permit or the
/// reason the request was refused.
pub type AdmitCallback = Box<dyn FnOnce(Result<OwnedPermit, AdmitError>) + Send + 'static>;

/// A queued callback request: its callback and the gate handle its permit
/// will hold, left in its cell until the thread that resolves the cell
/// calls it.
pub(super) struct QueuedCallback {
    callback: AdmitCallback,
    gate: Arc<AdmissionGate>,
}

impl QueuedCallback {
    pub(super) fn new(callback: AdmitCallback, gate: Arc<AdmissionGate>) -> Self {
        Self { callback, gate }
    }
}

impl Detached for QueuedCallback {
    fn resolve(self, outcome: Result<(), AdmitError>) {
        dispatch(self.callback, outcome.map(|()| OwnedPermit::new(self.gate)));
    }
}

/// Handle to a request registered with
/// [`AdmissionGate::admit_with_callback`]. Dropping it does not cancel the
/// request: the callback still fires exactly once.
pub struct CallbackTicket {
    gate: Arc<AdmissionGate>,
    /// The waiter's handle and its cell's generation, if the request was
    /// queued.
    cell: Option<(u32, u32)>,
}

impl CallbackTicket {
    pub(super) fn new(gate: Arc<AdmissionGate>, cell: Option<(u32, u32)>) -> Self {
        Self { gate, cell }
    }

    /// Takes the request out of the queue if it is still there (no lock).
    /// Returns true when it was: its place is free
    /// at once, the callback is dropped without being called and the
    /// request counts as cancelled. Returns false when the callback has
    /// already been called or is being called (it got a permit, which it
    /// owns, or a rejection).
    pub fn cancel(&self) -> bool {
        match self.cell {
            Some((id, gen)) => self.gate.raw.cancel_callback(id, gen),
            None => false,
        }
    }

    /// True while the request waits in the queue (one atomic load).
    pub fn is_queued(&self) -> bool {
        match self.cell {
            Some((id, gen)) => self.gate.raw.is_queued(id, gen),
            None => false,
        }
    }
}

impl fmt::Debug for CallbackTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackTicket")
            .field("queued", &self.is_queued())
            .finish_non_exhaustive()
    }
}

/// [`AdmissionGate::admit_with_callback`]: admits, rejects or queues, and
/// calls `callback` at once unless the request was queued.
pub(super) fn admit(
    gate: &Arc<AdmissionGate>,
    class: usize,
    callback: AdmitCallback,
) -> CallbackTicket {
    let outcome = match gate.raw.admit_fast(class) {
        Fast::Admitted => Ok(()),
        Fast::Rejected(e) => Err(e),
        Fast::Slow => {
            let waiter = Waiter::Callback(QueuedCallback {
                callback,
                gate: Arc::clone(gate),
            });
            let (outcome, back) = match gate.raw.enqueue(class, waiter) {
                Enqueued::Queued(id, gen) => {
                    return CallbackTicket::new(Arc::clone(gate), Some((id, gen)));
                }
                Enqueued::Direct(back) => (Ok(()), back),
                Enqueued::Rejected(e, back) => (Err(e), back),
            };
            if let Some(queued) = back {
                queued.resolve(outcome);
            }
            return CallbackTicket::new(Arc::clone(gate), None);
        }
    };
    dispatch(
        callback,
        outcome.map(|()| OwnedPermit::new(Arc::clone(gate))),
    );
    CallbackTicket::new(Arc::clone(gate), None)
}

/// A callback and its result, waiting for the outer dispatch on this thread.
type Deferred = (AdmitCallback, Result<OwnedPermit, AdmitError>);

/// Per-thread trampoline state, so that a callback which drops its permit
/// (which hands the slot to the next callback) does not recurse once per
/// queued request.
struct Dispatcher {
    active: Cell<bool>,
    deferred: RefCell<VecDeque<Deferred>>,
}

crate::sync::thread_local! {
    static DISPATCHER: Dispatcher = Dispatcher {
        active: Cell::new(false),
        deferred: RefCell::new(VecDeque::new()),
    };
}

/// Calls a callback; if this thread is already inside a callback, queues it
/// for that outer call to run next instead of recursing.
pub(super) fn dispatch(callback: AdmitCallback, result: Result<OwnedPermit, AdmitError>) {
    let mut job = Some((callback, result));
    let nested = DISPATCHER.try_with(|d| {
        if d.active.get() {
            if let Some(job) = job.take() {
                d.deferred.borrow_mut().push_back(job);
            }
            true
        } else {
            d.active.set(true);
            false
        }
    });
    let Some((callback, result)) = job else {
        return;
    };
    if nested.is_err() {
        // Thread-local storage is being torn down: call directly.
        callback(result);
        return;
    }
    debug_assert!(matches!(nested, Ok(false)));
    let _reset = DispatchReset;
    callback(result);
    while let Some((callback, result)) = pop_deferred() {
        callback(result);
    }
}

fn pop_deferred() -> Option<Deferred> {
    DISPATCHER
        .try_with(|d| d.deferred.borrow_mut().pop_front())
        .ok()
        .flatten()
}

/// Ends a dispatch. If a callback panicked, the callbacks it deferred still
/// run (each guarded), so none is lost and no permit is stranded.
struct DispatchReset;

impl Drop for DispatchReset {
    fn drop(&mut self) {
        let _ = DISPATCHER.try_with(|d| d.active.set(false));
        if std::thread::panicking() {
            while let Some((callback, result)) = pop_deferred() {
                let _ = catch_unwind(AssertUnwindSafe(|| callback(result)));
            }
        }
    }
}
