//! Permits: a held engine slot, borrowed ([`Permit`]) or owning a handle to
//! its gate ([`OwnedPermit`]). Dropping either gives the slot back: one
//! read-modify-write of the state word while nobody is queued, otherwise a
//! lock-free handoff to the oldest waiter (the newest, once, after an
//! expiry on a gate with adaptive LIFO).
//!
//! On a gate with a wait limit a permit also holds a wait slot until its
//! [`first_response`](Permit::first_response); a flag in the permit says
//! whether it still does, so the call is idempotent and a release gives
//! back exactly what the permit holds.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::AdmissionGate;

/// Whether a new permit of `gate` holds a wait slot: every admission on a
/// gate with a wait limit takes one.
#[inline]
fn holds_wait(gate: &AdmissionGate) -> AtomicBool {
    AtomicBool::new(gate.raw.wait_limit.is_some())
}

/// Takes the wait slot out of `waiting` once: true for exactly one caller.
#[inline]
fn take_wait_flag(waiting: &AtomicBool) -> bool {
    // Relaxed: the flag only decides which caller gives the wait slot back;
    // the gate orders the giving back itself (`wait.rs`). The load skips the
    // read-modify-write for a permit that holds none.
    waiting.load(Ordering::Relaxed) && waiting.swap(false, Ordering::Relaxed)
}

/// A held engine slot, borrowed from its gate. The slot is released when the
/// permit is dropped or [`released`](Permit::release), from any thread; a
/// release hands the slot straight to the oldest waiter.
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit<'a> {
    gate: &'a AdmissionGate,
    /// Still holds a wait slot (gates with a wait limit only).
    waiting: AtomicBool,
}

impl<'a> Permit<'a> {
    #[inline]
    pub(super) fn new(gate: &'a AdmissionGate) -> Self {
        Self {
            gate,
            waiting: holds_wait(gate),
        }
    }

    /// Releases the slot now (the same as dropping the permit).
    pub fn release(self) {
        drop(self);
    }

    /// Marks the request's first response: on a gate with a wait limit,
    /// gives back the permit's wait slot (to the oldest waiter, if a request
    /// slot is free too). The request slot stays held until the permit is
    /// released. Idempotent, callable from any thread; a no-op on a gate
    /// without a wait limit.
    pub fn first_response(&self) {
        if take_wait_flag(&self.waiting) {
            self.gate.raw.first_response();
        }
    }

    /// Whether the permit still holds a wait slot (a gate with a wait limit,
    /// and no [`first_response`](Self::first_response) yet).
    pub fn is_waiting(&self) -> bool {
        // Relaxed: a status read; it orders nothing.
        self.waiting.load(Ordering::Relaxed)
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
    pub fn into_owned(mut self, gate: &Arc<AdmissionGate>) -> OwnedPermit {
        assert!(
            std::ptr::eq(self.gate, Arc::as_ptr(gate)),
            "Permit::into_owned called with another gate"
        );
        let waiting = AtomicBool::new(*self.waiting.get_mut());
        std::mem::forget(self);
        OwnedPermit {
            gate: Arc::clone(gate),
            waiting,
        }
    }
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        self.gate.raw.release_held(*self.waiting.get_mut());
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
    /// Still holds a wait slot (gates with a wait limit only).
    waiting: AtomicBool,
}

impl OwnedPermit {
    #[inline]
    pub(super) fn new(gate: Arc<AdmissionGate>) -> Self {
        let waiting = holds_wait(&gate);
        Self { gate, waiting }
    }

    /// Releases the slot now (the same as dropping the permit).
    pub fn release(self) {
        drop(self);
    }

    /// As [`Permit::first_response`]: gives back the wait slot, once.
    pub fn first_response(&self) {
        if take_wait_flag(&self.waiting) {
            self.gate.raw.first_response();
        }
    }

    /// As [`Permit::is_waiting`].
    pub fn is_waiting(&self) -> bool {
        // Relaxed: a status read; it orders nothing.
        self.waiting.load(Ordering::Relaxed)
    }

    /// The gate this permit belongs to.
    pub fn gate(&self) -> &Arc<AdmissionGate> {
        &self.gate
    }

    /// Turns the permit into a raw pointer for a foreign-function boundary,
    /// keeping its slot held and allocating nothing. The pointer is the
    /// gate's address, with the lowest bit set while the permit still holds
    /// a wait slot, so permits of one gate in the same state compare equal;
    /// take each one back exactly once with [`from_raw`](Self::from_raw).
    pub fn into_raw(self) -> *const AdmissionGate {
        let mut this = std::mem::ManuallyDrop::new(self);
        let tag = usize::from(*this.waiting.get_mut());
        // SAFETY: `this` is never dropped, so moving its `Arc` out leaves no
        // second owner behind; the slot stays held by the returned pointer.
        let gate = unsafe { std::ptr::read(&this.gate) };
        Arc::into_raw(gate).map_addr(|a| a | tag)
    }

    /// Takes back a permit turned into a pointer by
    /// [`into_raw`](Self::into_raw).
    ///
    /// # Safety
    /// `raw` came from `into_raw` and is taken back only once.
    pub unsafe fn from_raw(raw: *const AdmissionGate) -> Self {
        let waiting = AtomicBool::new(raw.addr() & WAIT_TAG != 0);
        // SAFETY: without its tag bit, `raw` is an `Arc` pointer from
        // `into_raw`, reclaimed once (caller's contract), so ownership of the
        // gate handle and of the slot returns here.
        let gate = unsafe { Arc::from_raw(raw.map_addr(|a| a & !WAIT_TAG)) };
        Self { gate, waiting }
    }
}

/// The bit of a raw permit that says it still holds a wait slot: free in
/// the gate's address, which is aligned to far more than 2 bytes.
const WAIT_TAG: usize = 1;
const _: () = assert!(std::mem::align_of::<AdmissionGate>() > WAIT_TAG);

impl Drop for OwnedPermit {
    #[inline]
    fn drop(&mut self) {
        self.gate.raw.release_held(*self.waiting.get_mut());
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit").finish_non_exhaustive()
    }
}
