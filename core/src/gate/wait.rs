//! The ways to hold and to wait for a slot: permits, futures, callbacks, and
//! the list of waiters to tell once the gate's lock is released.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::table::Waiter;
use super::{AdmissionGate, AdmitError, Enqueued, Fast};

/// The callback form's callback: called exactly once, with a permit or the
/// reason the request was refused.
pub type AdmitCallback = Box<dyn FnOnce(Result<OwnedPermit, AdmitError>) + Send + 'static>;

/// A held engine slot, borrowed from its gate. The slot is released when the
/// permit is dropped or [`released`](Permit::release), from any thread; a
/// release hands the slot straight to the oldest waiter.
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit<'a> {
    gate: &'a AdmissionGate,
}

impl<'a> Permit<'a> {
    pub(super) fn new(gate: &'a AdmissionGate) -> Self {
        Self { gate }
    }

    /// Releases the slot now (the same as dropping the permit).
    pub fn release(self) {
        drop(self);
    }

    /// The gate this permit belongs to.
    pub fn gate(&self) -> &'a AdmissionGate {
        self.gate
    }

    /// Turns the permit into an [`OwnedPermit`] of `gate`, which must be the
    /// gate it was taken from. The slot is kept, not released and re-taken.
    ///
    /// # Panics
    /// If `gate` is another gate.
    pub fn into_owned(self, gate: &Arc<AdmissionGate>) -> OwnedPermit {
        assert!(
            std::ptr::eq(self.gate, Arc::as_ptr(gate)),
            "Permit::into_owned called with another gate"
        );
        std::mem::forget(self);
        OwnedPermit {
            gate: Arc::clone(gate),
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.gate.release_slot();
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").finish_non_exhaustive()
    }
}

/// A held engine slot that owns a handle to its gate, so it can outlive the
/// borrow it was taken with (e.g. move into a spawned task or a stream).
/// Released when dropped or [`released`](OwnedPermit::release).
#[must_use = "dropping a permit releases its slot at once"]
pub struct OwnedPermit {
    gate: Arc<AdmissionGate>,
}

impl OwnedPermit {
    pub(super) fn new(gate: Arc<AdmissionGate>) -> Self {
        Self { gate }
    }

    /// Releases the slot now (the same as dropping the permit).
    pub fn release(self) {
        drop(self);
    }

    /// The gate this permit belongs to.
    pub fn gate(&self) -> &Arc<AdmissionGate> {
        &self.gate
    }

    /// Turns the permit into a raw pointer for a foreign-function boundary,
    /// keeping its slot held and allocating nothing. The pointer is the
    /// gate's address, so permits of one gate compare equal; take each one
    /// back exactly once with [`from_raw`](Self::from_raw).
    pub fn into_raw(self) -> *const AdmissionGate {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so moving its `Arc` out leaves no
        // second owner behind; the slot stays held by the returned pointer.
        let gate = unsafe { std::ptr::read(&this.gate) };
        Arc::into_raw(gate)
    }

    /// Takes back a permit turned into a pointer by
    /// [`into_raw`](Self::into_raw).
    ///
    /// # Safety
    /// `raw` came from `into_raw` and is taken back only once.
    pub unsafe fn from_raw(raw: *const AdmissionGate) -> Self {
        // SAFETY: `raw` is an `Arc` pointer from `into_raw`, reclaimed once
        // (caller's contract), so ownership of the gate handle and of the
        // slot returns here.
        let gate = unsafe { Arc::from_raw(raw) };
        Self { gate }
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.gate.release_slot();
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit").finish_non_exhaustive()
    }
}

/// Where a future stands.
#[derive(Debug, Clone, Copy)]
pub(super) enum WaitState {
    /// Not polled yet.
    Start,
    /// Queued in this cell.
    Queued(u32),
    /// Returned its output.
    Done,
}

/// The shared poll of both futures.
fn poll_admit(
    gate: &AdmissionGate,
    state: &mut WaitState,
    waker: &Waker,
) -> Poll<Result<(), AdmitError>> {
    let outcome = match *state {
        WaitState::Start => match gate.admit_fast() {
            Fast::Admitted => Ok(()),
            Fast::Rejected(e) => Err(e),
            Fast::Slow => {
                let mut wakes = WakeList::new();
                let step = gate.enqueue(Waiter::Task(Some(waker.clone())), &mut wakes);
                wakes.run(gate);
                match step {
                    Enqueued::Direct(_) => Ok(()),
                    Enqueued::Rejected(e, _) => Err(e),
                    Enqueued::Queued(idx, _) => {
                        *state = WaitState::Queued(idx);
                        return Poll::Pending;
                    }
                }
            }
        },
        WaitState::Queued(idx) => match gate.poll_cell(idx, waker) {
            Poll::Ready(r) => r,
            Poll::Pending => return Poll::Pending,
        },
        WaitState::Done => panic!("admission future polled after it completed"),
    };
    *state = WaitState::Done;
    Poll::Ready(outcome)
}

/// Future of [`AdmissionGate::admit`]: resolves to a [`Permit`] or the reason
/// the request was refused. It joins the queue when first polled; dropping it
/// while queued leaves the queue at once (a cancellation, not a rejection),
/// and dropping it after a slot was handed to it releases that slot.
///
/// It is `Unpin` and needs nothing from the executor but its waker, so any
/// executor, or a hand-written loop calling `poll`, can drive it.
#[must_use = "futures do nothing unless polled"]
pub struct Admit<'a> {
    gate: &'a AdmissionGate,
    state: WaitState,
}

impl<'a> Admit<'a> {
    pub(super) fn new(gate: &'a AdmissionGate) -> Self {
        Self {
            gate,
            state: WaitState::Start,
        }
    }

    /// True while the future sits in the queue (polled, not yet resolved).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, WaitState::Queued(_))
    }
}

impl<'a> Future for Admit<'a> {
    type Output = Result<Permit<'a>, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        poll_admit(this.gate, &mut this.state, cx.waker()).map_ok(|()| Permit::new(this.gate))
    }
}

impl Drop for Admit<'_> {
    fn drop(&mut self) {
        if let WaitState::Queued(idx) = self.state {
            self.gate.cancel_cell(idx);
        }
    }
}

impl fmt::Debug for Admit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Future of [`AdmissionGate::admit_owned`]: like [`Admit`], resolving to an
/// [`OwnedPermit`]. It is `'static`, so it can be stored or spawned.
#[must_use = "futures do nothing unless polled"]
pub struct AdmitOwned {
    gate: Arc<AdmissionGate>,
    state: WaitState,
}

impl AdmitOwned {
    pub(super) fn new(gate: Arc<AdmissionGate>) -> Self {
        Self {
            gate,
            state: WaitState::Start,
        }
    }

    /// True while the future sits in the queue (polled, not yet resolved).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, WaitState::Queued(_))
    }
}

impl Future for AdmitOwned {
    type Output = Result<OwnedPermit, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        poll_admit(&this.gate, &mut this.state, cx.waker())
            .map_ok(|()| OwnedPermit::new(Arc::clone(&this.gate)))
    }
}

impl Drop for AdmitOwned {
    fn drop(&mut self) {
        if let WaitState::Queued(idx) = self.state {
            self.gate.cancel_cell(idx);
        }
    }
}

impl fmt::Debug for AdmitOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmitOwned")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Handle to a request registered with
/// [`AdmissionGate::admit_with_callback`]. Dropping it does not cancel the
/// request: the callback still fires exactly once.
pub struct CallbackTicket {
    gate: Arc<AdmissionGate>,
    /// The queue cell and its generation, if the request was queued.
    cell: Option<(u32, u32)>,
}

impl CallbackTicket {
    pub(super) fn new(gate: Arc<AdmissionGate>, cell: Option<(u32, u32)>) -> Self {
        Self { gate, cell }
    }

    /// Takes the request out of the queue if it is still there. Returns true
    /// when it was: the callback is then dropped without being called and the
    /// request counts as cancelled. Returns false when the callback has
    /// already been called or is being called (it got a permit, which it
    /// owns, or a rejection).
    pub fn cancel(&self) -> bool {
        match self.cell {
            Some((idx, gen)) => self.gate.cancel_callback(idx, gen),
            None => false,
        }
    }

    /// True while the request waits in the queue.
    pub fn is_queued(&self) -> bool {
        match self.cell {
            Some((idx, gen)) => self.gate.callback_queued(idx, gen),
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

/// One waiter to tell after the lock is released.
pub(super) enum Wake {
    /// Wake a task.
    Task(Waker),
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
const WAKE_BATCH: usize = 32;

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
    pub(super) fn run(&mut self, gate: &AdmissionGate) {
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
        wakes.run(&gate);
        assert_eq!(counter.0.load(Ordering::Relaxed), WAKE_BATCH);
        assert_eq!(Arc::strong_count(&counter), 1, "every waker consumed");
        assert_eq!(wakes.room(), WAKE_BATCH);
        wakes.push(Wake::Task(Waker::from(Arc::clone(&counter))));
        wakes.run(&gate);
        wakes.run(&gate);
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
