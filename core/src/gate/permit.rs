//! Permits: a held engine slot, borrowed ([`Permit`]) or owning a handle to
//! its gate ([`OwnedPermit`]). Dropping either gives the slot back: one CAS
//! on the state word while nobody is queued, otherwise a handoff to the
//! oldest waiter under the gate's mutex.

use std::fmt;
use std::sync::Arc;

use super::AdmissionGate;

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
        self.gate.raw.release_slot();
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
        self.gate.raw.release_slot();
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit").finish_non_exhaustive()
    }
}
