//! `lg_ticket`: the handle of an asynchronous admit, to cancel it.

use loadgate_core::gate::CallbackTicket;

use crate::ffi::{boundary, guard, input, Out};
use crate::status::lg_status;

/// The handle of a request made with lg_gate_admit_async() or
/// lg_gate_admit_async_at(). Opaque; free with lg_ticket_free(). Freeing it
/// does not cancel the request.
///
/// A ticket may be used from any number of threads at once.
pub struct lg_ticket {
    ticket: CallbackTicket,
}

impl lg_ticket {
    pub(crate) fn into_raw(ticket: CallbackTicket) -> *mut lg_ticket {
        Box::into_raw(Box::new(lg_ticket { ticket }))
    }
}

/// Takes the request out of the queue if it is still there.
/// *out_cancelled is true when it was: the callback will never be called
/// and the request counts as cancelled (not rejected). False when the
/// callback has already run or is running (it got a permit, which it owns,
/// or a rejection).
///
/// Errors: LG_INVALID_ARGUMENT (NULL ticket or out_cancelled).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `ticket` is NULL or a live ticket; `out_cancelled` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_ticket_cancel(
    ticket: *const lg_ticket,
    out_cancelled: *mut bool,
) -> lg_status {
    guard(|| {
        // SAFETY: `ticket` is NULL or live (contract).
        let t = unsafe { input(ticket, "ticket") }?;
        let out = Out::new(out_cancelled, "out_cancelled")?;
        let cancelled = t.ticket.cancel();
        // SAFETY: `out_cancelled` is writable (contract).
        unsafe { out.write(cancelled) };
        Ok(())
    })
}

/// Whether the request still waits in the queue.
///
/// Errors: LG_INVALID_ARGUMENT (NULL ticket or out_queued).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (one atomic load).
///
/// # Safety
/// `ticket` is NULL or a live ticket; `out_queued` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_ticket_is_queued(
    ticket: *const lg_ticket,
    out_queued: *mut bool,
) -> lg_status {
    guard(|| {
        // SAFETY: `ticket` is NULL or live (contract).
        let t = unsafe { input(ticket, "ticket") }?;
        let out = Out::new(out_queued, "out_queued")?;
        let queued = t.ticket.is_queued();
        // SAFETY: `out_queued` is writable (contract).
        unsafe { out.write(queued) };
        Ok(())
    })
}

/// Frees a ticket. NULL is a no-op. The request is not cancelled: its
/// callback still runs exactly once.
///
/// Ownership: takes `ticket`.
/// Thread safety: any thread, but no other thread may be using the ticket.
/// Blocking: never.
///
/// # Safety
/// `ticket` is NULL or was returned by lg_gate_admit_async() and not freed
/// yet.
#[no_mangle]
pub unsafe extern "C" fn lg_ticket_free(ticket: *mut lg_ticket) {
    boundary((), || {
        if !ticket.is_null() {
            // SAFETY: a live handle given up by the caller (contract).
            drop(unsafe { Box::from_raw(ticket) });
        }
    })
}
