//! `lg_permit`: a held engine slot, and the callback of asynchronous admits.

use loadgate_core::gate::{AdmitError, OwnedPermit};
use std::ffi::c_void;

use crate::ffi::boundary;
use crate::status::{admit_status, lg_status};

/// A held engine slot of a gate. Opaque; obtained from lg_gate_try_admit(),
/// lg_gate_admit() or an lg_gate_admit_async() callback (or their _at
/// forms); released with lg_permit_release() exactly once, from any thread
/// (for a streamed response: when the stream ends). A permit keeps its
/// gate's state alive.
///
/// The slots of a gate are interchangeable, and so are its permits: the
/// pointer value identifies the gate (and, on a gate with a wait limit,
/// whether the permit still holds a wait slot), not the request, and two
/// permits of one gate may compare equal. Keep one per request; do not use it as a
/// lookup key. Handing out a permit allocates nothing.
pub struct lg_permit {
    _opaque: [u8; 0],
}

// A permit crosses the boundary as core's own raw form of an `OwnedPermit`
// (the gate's `Arc` pointer), so handing it to C and taking it back
// allocates nothing and keeps lg_gate_try_admit() + lg_permit_release() as
// cheap as the Rust calls.
impl lg_permit {
    /// Hands a permit to C as an opaque, non-NULL pointer value.
    #[inline]
    pub(crate) fn into_raw(permit: OwnedPermit) -> *mut lg_permit {
        permit.into_raw().cast_mut().cast()
    }

    /// Takes back a permit handed out by [`lg_permit::into_raw`].
    ///
    /// # Safety
    /// `raw` was returned by `into_raw` and is taken back only once.
    #[inline]
    unsafe fn from_raw(raw: *mut lg_permit) -> OwnedPermit {
        // SAFETY: `raw` is the unchanged pointer from `OwnedPermit::into_raw`,
        // taken back once (contract).
        unsafe { OwnedPermit::from_raw(raw.cast_const().cast()) }
    }
}

/// Releases a permit's slot: it goes straight to the oldest waiter, if any
/// (whose asynchronous callback then runs on this thread). NULL is a no-op.
///
/// Ownership: takes `permit`; call exactly once per permit.
/// Thread safety: any thread. Blocking: never (lock-free, handing the
/// slot to a waiter included).
///
/// # Safety
/// `permit` is NULL or a permit from this library not released yet.
#[no_mangle]
pub unsafe extern "C" fn lg_permit_release(permit: *mut lg_permit) {
    boundary((), || {
        if !permit.is_null() {
            // SAFETY: a permit from this library not released yet, given
            // up by the caller (contract); dropping it releases the slot.
            drop(unsafe { lg_permit::from_raw(permit) });
        }
    })
}

/// Marks the first response of the request holding `*permit`: on a gate
/// with a wait limit, gives back the permit's wait slot (to the oldest
/// waiter, if a request slot is free too) and updates `*permit` to the
/// handle of the same permit without its wait slot; use the updated handle
/// from then on. Calling it again (with the updated handle) does nothing,
/// and so does calling it on a gate without a wait limit. The request slot
/// stays held until lg_permit_release(). NULL (or *permit NULL) is a no-op.
///
/// Ownership: borrows the permit; `*permit` is still owned by the caller.
/// Thread safety: any thread, but not at the same time as another call on
/// the same permit. Blocking: never (lock-free); runs the callback of an
/// asynchronous request it hands the slot to on this thread; never
/// allocates.
///
/// # Safety
/// `permit` is NULL or valid for reads and writes, and `*permit` is NULL or
/// a permit from this library not released yet.
#[no_mangle]
pub unsafe extern "C" fn lg_permit_first_response(permit: *mut *mut lg_permit) {
    boundary((), || {
        if permit.is_null() {
            return;
        }
        // SAFETY: `permit` is readable (contract).
        let raw = unsafe { permit.read() };
        if raw.is_null() {
            return;
        }
        // SAFETY: a permit from this library not released yet (contract);
        // handed back to the caller below, so it is taken back only once.
        // Not dropped even if the call below panicked: the caller keeps it.
        let owned = std::mem::ManuallyDrop::new(unsafe { lg_permit::from_raw(raw) });
        owned.first_response();
        let updated = lg_permit::into_raw(std::mem::ManuallyDrop::into_inner(owned));
        // SAFETY: `permit` is writable (contract).
        unsafe { permit.write(updated) };
    })
}

/// The callback of lg_gate_admit_async() and lg_gate_admit_async_at():
/// called exactly once with the caller's user_data and either LG_OK and a
/// permit (which the callee then owns) or LG_AT_CAPACITY, LG_QUEUE_TIMEOUT,
/// LG_DISPLACED (only at a priority past class 0) or LG_CLOSED and NULL. It
/// may run on any thread and must not unwind.
#[allow(non_camel_case_types)]
pub type lg_admit_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, status: lg_status, permit: *mut lg_permit)>;

/// A C callback and its user data, carried to whichever thread resolves
/// the request.
pub(crate) struct CallbackTarget {
    callback: unsafe extern "C" fn(*mut c_void, lg_status, *mut lg_permit),
    user_data: *mut c_void,
}

// SAFETY: the caller of lg_gate_admit_async() promises that the callback
// may be called with `user_data` from any thread (see `CallbackTarget::new`).
unsafe impl Send for CallbackTarget {}

impl CallbackTarget {
    /// # Safety
    /// `callback` must be safe to call once with `user_data` from any
    /// thread.
    pub(crate) unsafe fn new(
        callback: unsafe extern "C" fn(*mut c_void, lg_status, *mut lg_permit),
        user_data: *mut c_void,
    ) -> Self {
        Self {
            callback,
            user_data,
        }
    }

    /// Calls the C callback with the outcome, turning a permit into a
    /// handle the callee owns.
    pub(crate) fn call(self, outcome: Result<OwnedPermit, AdmitError>) {
        let (status, permit) = match outcome {
            Ok(permit) => (lg_status::LG_OK, lg_permit::into_raw(permit)),
            Err(e) => (admit_status(e), std::ptr::null_mut()),
        };
        // SAFETY: callable with `user_data` from this thread (contract of
        // `new`); the permit handle (or NULL) is handed over to the callee.
        unsafe { (self.callback)(self.user_data, status, permit) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadgate_core::gate::{AdmissionGate, GateConfig};
    use std::sync::Arc;

    #[test]
    fn permits_round_trip_through_c_without_losing_their_slot() {
        let gate = Arc::new(AdmissionGate::new(GateConfig::new(2)).unwrap());
        let a = lg_permit::into_raw(gate.try_admit_owned().unwrap());
        let b = lg_permit::into_raw(gate.try_admit_owned().unwrap());
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(gate.running(), 2);
        assert_eq!(Arc::strong_count(&gate), 3, "each permit holds the gate");
        // SAFETY: `a` came from into_raw and is released once.
        unsafe { lg_permit_release(a) };
        assert_eq!(gate.running(), 1);
        // SAFETY: as above, for `b`.
        unsafe { lg_permit_release(b) };
        assert_eq!(gate.running(), 0);
        assert_eq!(Arc::strong_count(&gate), 1);
        // SAFETY: NULL is a no-op.
        unsafe { lg_permit_release(std::ptr::null_mut()) };
    }

    #[test]
    fn first_response_updates_the_handle_and_is_idempotent() {
        let config = GateConfig::new(2).with_wait_limit(Some(1));
        let gate = Arc::new(AdmissionGate::new(config).unwrap());
        let mut p = lg_permit::into_raw(gate.try_admit_owned().unwrap());
        assert_eq!(gate.stats().waiting, 1);
        // SAFETY: `p` is a live permit handle, updated in place.
        unsafe { lg_permit_first_response(&mut p) };
        assert_eq!(gate.stats().waiting, 0);
        // SAFETY: as above; a second call is a no-op.
        unsafe { lg_permit_first_response(&mut p) };
        assert_eq!((gate.stats().waiting, gate.running()), (0, 1));
        // SAFETY: NULL handles are no-ops.
        unsafe {
            lg_permit_first_response(std::ptr::null_mut());
            let mut none: *mut lg_permit = std::ptr::null_mut();
            lg_permit_first_response(&mut none);
        }
        // SAFETY: the updated handle, released once.
        unsafe { lg_permit_release(p) };
        assert_eq!(gate.running(), 0);
        assert_eq!(Arc::strong_count(&gate), 1);
    }
}
