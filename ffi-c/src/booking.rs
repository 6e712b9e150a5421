//! `lg_booking`: a routed request's KV blocks, counted in a rank's
//! router-side `active_decode_blocks` until freed.

use loadgate_core::monitor::Booking;

use crate::ffi::{boundary, guard, input, Out};
use crate::monitor::lg_monitor;
use crate::status::lg_status;

/// A request's KV blocks booked on a worker rank by the router (the
/// reference's --router-track-output-blocks). Opaque; create with
/// lg_monitor_book(), free (which frees the blocks) with lg_booking_free().
///
/// A booking may be used by one thread at a time; it may be freed on any
/// thread, and after the monitor itself was freed.
pub struct lg_booking {
    booking: Booking,
}

impl lg_booking {
    /// The booking of a handle used by this thread alone.
    ///
    /// # Safety
    /// `p` is NULL or a live booking used by no other thread during the
    /// borrow.
    pub(crate) unsafe fn get_mut<'a>(
        p: *mut lg_booking,
    ) -> Result<&'a mut Booking, crate::ffi::Error> {
        if p.is_null() {
            return Err(crate::ffi::Error::invalid("booking must not be NULL"));
        }
        // SAFETY: non-NULL (checked) and live, used by this thread alone
        // (contract), so a unique reference is sound.
        Ok(unsafe { &mut (*p).booking })
    }

    /// The booking itself, out of its handle.
    pub(crate) fn into_inner(self) -> Booking {
        self.booking
    }
}

/// Books `blocks` KV blocks of a routed request on rank `dp_rank` of a
/// worker: they count in that rank's active_decode_blocks (and so in its
/// busy state) until the booking is freed.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_booking), LG_NOT_FOUND
/// (unknown worker or undeclared rank), LG_WORKER_OVERLOADED (in booking
/// sync's leased mode: no room in this frontend's share of the rank).
/// Ownership: on LG_OK *out_booking owns a new booking; free it with
/// lg_booking_free().
/// Thread safety: any thread. Blocking: never (lock-free; allocates the
/// handle).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `out_booking` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_book(
    monitor: *const lg_monitor,
    worker_id: u64,
    dp_rank: u32,
    blocks: u64,
    out_booking: *mut *mut lg_booking,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        let out = Out::new(out_booking, "out_booking")?;
        let booking = m.monitor.book(worker_id, dp_rank, blocks)?;
        let handle = Box::into_raw(Box::new(lg_booking { booking }));
        // SAFETY: `out_booking` is writable (contract).
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// lg_monitor_book(), and also books the request's `prefill_tokens` prompt
/// tokens in that rank's active_prefill_tokens (the router-side prefill
/// count) until lg_booking_prefill_done() or lg_booking_free(). So the
/// prefill thresholds work beside workers that do not report prefill
/// tokens; a worker whose router books them must not report them too (a
/// report overwrites the count). 0 books no prefill.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_booking), LG_NOT_FOUND
/// (unknown worker or undeclared rank), LG_WORKER_OVERLOADED (in booking
/// sync's leased mode: no room in this frontend's share of the rank).
/// Ownership: on LG_OK *out_booking owns a new booking; free it with
/// lg_booking_free().
/// Thread safety: any thread. Blocking: never (lock-free; allocates the
/// handle).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `out_booking` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_book_prefill(
    monitor: *const lg_monitor,
    worker_id: u64,
    dp_rank: u32,
    blocks: u64,
    prefill_tokens: u64,
    out_booking: *mut *mut lg_booking,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        let out = Out::new(out_booking, "out_booking")?;
        let booking = m
            .monitor
            .book_with_prefill(worker_id, dp_rank, blocks, prefill_tokens)?;
        let handle = Box::into_raw(Box::new(lg_booking { booking }));
        // SAFETY: `out_booking` is writable (contract).
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// The request's prefill is done (its first token came): its prompt tokens
/// stop counting in active_prefill_tokens; the blocks stay booked. Calling
/// it again does nothing.
///
/// Errors: LG_INVALID_ARGUMENT (NULL booking).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: one thread at a time per booking. Blocking: never
/// (lock-free).
///
/// # Safety
/// `booking` is NULL or a live booking not used by another thread during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_prefill_done(booking: *mut lg_booking) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by this thread alone (contract).
        unsafe { lg_booking::get_mut(booking) }?.prefill_done();
        Ok(())
    })
}

/// Adds `blocks` generated output blocks to a booking and re-evaluates the
/// worker.
///
/// Errors: LG_INVALID_ARGUMENT (NULL booking).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: one thread at a time per booking. Blocking: never
/// (lock-free).
///
/// # Safety
/// `booking` is NULL or a live booking not used by another thread during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_add_output_blocks(
    booking: *mut lg_booking,
    blocks: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by this thread alone (contract).
        unsafe { lg_booking::get_mut(booking) }?.add_output_blocks(blocks);
        Ok(())
    })
}

/// The blocks a booking holds now.
///
/// Errors: LG_INVALID_ARGUMENT (NULL booking or out_blocks).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: one thread at a time per booking. Blocking: never.
///
/// # Safety
/// `booking` is NULL or a live booking; `out_blocks` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_blocks(
    booking: *const lg_booking,
    out_blocks: *mut u64,
) -> lg_status {
    guard(|| {
        // SAFETY: `booking` is NULL or live (contract).
        let b = unsafe { input(booking, "booking") }?;
        let out = Out::new(out_blocks, "out_blocks")?;
        // SAFETY: `out_blocks` is writable (contract).
        unsafe { out.write(b.booking.blocks()) };
        Ok(())
    })
}

/// Frees a booking and its blocks (they stop counting at once). NULL is a
/// no-op.
///
/// Ownership: takes `booking`.
/// Thread safety: any thread, but no other thread may be using the booking.
/// Blocking: never (lock-free).
///
/// # Safety
/// `booking` is NULL or was returned by lg_monitor_book() and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_free(booking: *mut lg_booking) {
    boundary((), || {
        if !booking.is_null() {
            // SAFETY: a live handle from lg_monitor_book(), given up by the
            // caller (contract).
            drop(unsafe { Box::from_raw(booking) });
        }
    })
}
