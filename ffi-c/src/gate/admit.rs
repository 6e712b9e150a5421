//! `lg_gate`'s admit calls: the immediate (lg_gate_try_admit*), blocking
//! (lg_gate_admit*) and asynchronous (lg_gate_admit_async*) ways to ask for
//! a slot, each for class 0 and for a given priority class, over one body
//! per kind. Kept apart from construction and the gate's controls because
//! they are the hot path and carry the permit and ticket ownership rules.

use std::ffi::c_void;
use std::time::Duration;

use crate::ffi::{guard, input, Error, Out};
use crate::permit::{lg_admit_callback, lg_permit, CallbackTarget};
use crate::status::lg_status;
use crate::ticket::lg_ticket;

use super::{lg_gate, LG_TIMEOUT_INFINITE};

/// Takes a slot only if one is free and nobody is queued; never waits and
/// never queues. The request is of priority class 0, the most important
/// (see lg_gate_try_admit_at()).
///
/// Errors: LG_WOULD_WAIT (no free slot, or others are waiting; not counted
/// as a rejection), LG_CLOSED, LG_INVALID_ARGUMENT (NULL gate or
/// out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: never (lock-free; allocates the
/// permit handle).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_try_admit(
    gate: *const lg_gate,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { try_admit(gate, 0, out_permit) }
}

/// lg_gate_try_admit() for a request of priority class `priority` (0 the
/// most important; a priority past the gate's last class counts as the
/// last): takes a slot only if one is free within the class's share (see
/// lg_gate_class.reserved) and no request of this class or a more
/// important one is waiting; never waits and never queues.
///
/// Errors: LG_WOULD_WAIT (no slot free for this class, or requests of this
/// class or a more important one are waiting; not counted as a rejection),
/// LG_CLOSED, LG_INVALID_ARGUMENT (NULL gate or out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_try_admit_at(
    gate: *const lg_gate,
    priority: u8,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { try_admit(gate, priority, out_permit) }
}

/// lg_gate_try_admit_at(): the body of both try-admit calls.
///
/// # Safety
/// As lg_gate_try_admit().
#[inline(always)]
unsafe fn try_admit(
    gate: *const lg_gate,
    priority: u8,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_permit, "out_permit")?;
        let permit = g.gate.try_admit_owned_at(priority)?;
        // SAFETY: `out_permit` is writable (contract).
        unsafe { out.write(lg_permit::into_raw(permit)) };
        Ok(())
    })
}

/// Asks for a slot and blocks the calling thread until it is granted, the
/// request is rejected, or `timeout_ms` passes (LG_TIMEOUT_INFINITE: no
/// limit). Admits at once when a slot is free and nobody waits; queues
/// (FIFO) when the queue has room; else rejects. The request is of
/// priority class 0, the most important (see lg_gate_admit_at()).
///
/// Errors: LG_AT_CAPACITY (slots and queue full), LG_QUEUE_TIMEOUT (waited
/// past the gate's queue deadline), LG_CLOSED (closed before or while
/// waiting), LG_TIMED_OUT (timeout_ms ran out first; the request left the
/// queue as a cancellation), LG_INVALID_ARGUMENT (NULL gate or out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: yes, up to timeout_ms (and up to
/// the queue deadline); the handle must stay alive meanwhile.
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit(
    gate: *const lg_gate,
    timeout_ms: u64,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit(gate, 0, timeout_ms, out_permit) }
}

/// lg_gate_admit() for a request of priority class `priority` (0 the most
/// important; a priority past the gate's last class counts as the last).
/// Admits at once when a slot is free within the class's share and no
/// request of this class or a more important one waits; queues when the
/// class's queue has room and so has the whole queue, or when the whole
/// queue is full but holds a waiter of a less important class, which is
/// displaced (LG_DISPLACED); else rejects. Waiters are served most
/// important class first, FIFO within a class.
///
/// Errors: LG_AT_CAPACITY (no slot for the class and no place in the
/// queue), LG_QUEUE_TIMEOUT (waited past the class's queue deadline),
/// LG_DISPLACED (while waiting, gave its place in the full queue to a more
/// important arrival; never for class 0), LG_CLOSED (closed before or while
/// waiting), LG_TIMED_OUT (timeout_ms ran out first; the request left the
/// queue as a cancellation), LG_INVALID_ARGUMENT (NULL gate or out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: yes, up to timeout_ms (and up to
/// the class's queue deadline); the handle must stay alive meanwhile.
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit_at(
    gate: *const lg_gate,
    priority: u8,
    timeout_ms: u64,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit(gate, priority, timeout_ms, out_permit) }
}

/// lg_gate_admit_at(): the body of both blocking admits.
///
/// # Safety
/// As lg_gate_admit().
unsafe fn admit(
    gate: *const lg_gate,
    priority: u8,
    timeout_ms: u64,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_permit, "out_permit")?;
        let timeout =
            (timeout_ms != LG_TIMEOUT_INFINITE).then(|| Duration::from_millis(timeout_ms));
        let permit = g.gate.admit_blocking_owned_at(priority, timeout)?;
        // SAFETY: `out_permit` is writable (contract).
        unsafe { out.write(lg_permit::into_raw(permit)) };
        Ok(())
    })
}

/// Asks for a slot without blocking and calls `callback(user_data, status,
/// permit)` exactly once with the outcome: LG_OK with a permit, or
/// LG_AT_CAPACITY, LG_QUEUE_TIMEOUT or LG_CLOSED with a NULL permit. The
/// callback runs at once on this thread if the request is admitted or
/// rejected straight away; otherwise later, on the thread that releases a
/// permit, calls lg_gate_set_limit(), lg_gate_expire() or lg_gate_close(),
/// or another admit that finds the queue's head past its deadline. The only
/// way it is not called is a successful lg_ticket_cancel(). The request is
/// of priority class 0, the most important (see lg_gate_admit_async_at()).
///
/// The callback must be quick, must not throw or unwind, and must not
/// block on the gate; it may release its permit at once or ask for another
/// slot. With a queue deadline, call lg_gate_expire() when
/// lg_gate_next_deadline() says so, or expired requests are told only when
/// the queue next moves.
///
/// `out_ticket` (may be NULL) receives a ticket that can cancel the request
/// while it waits. The callback may already have run (on this or another
/// thread) by the time this function returns.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or callback); then the callback
/// is never called. Rejections are reported through the callback, not the
/// return value.
/// Ownership: the permit passed to the callback belongs to the callback's
/// owner: release it with lg_permit_release() exactly once, from any thread.
/// On LG_OK *out_ticket owns a ticket; free it with lg_ticket_free().
/// `user_data` is passed through untouched and must stay valid until the
/// callback has run or the request was cancelled.
/// Thread safety: any thread; `user_data` must be usable from the thread
/// the callback runs on. Blocking: never (lock-free; allocates the
/// callback's box).
///
/// # Safety
/// `gate` is NULL or a live gate; `callback` is NULL or a function that is
/// safe to call with `user_data` from any thread; `out_ticket` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit_async(
    gate: *const lg_gate,
    callback: lg_admit_callback,
    user_data: *mut c_void,
    out_ticket: *mut *mut lg_ticket,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit_async(gate, 0, callback, user_data, out_ticket) }
}

/// lg_gate_admit_async() for a request of priority class `priority` (0 the
/// most important; a priority past the gate's last class counts as the
/// last), admitted, queued or rejected as lg_gate_admit_at() describes.
/// The callback gets LG_OK with a permit, or LG_AT_CAPACITY,
/// LG_QUEUE_TIMEOUT, LG_DISPLACED (the request waited in the full queue and
/// a more important arrival took its place; never for class 0) or
/// LG_CLOSED with a NULL permit. A displaced request's callback runs on the
/// thread of the admit call that displaced it; otherwise the callback runs
/// where lg_gate_admit_async() says, under the same rules.
///
/// `out_ticket` (may be NULL) receives a ticket that can cancel the request
/// while it waits. The callback may already have run (on this or another
/// thread) by the time this function returns.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or callback); then the callback
/// is never called. Rejections are reported through the callback, not the
/// return value.
/// Ownership: as lg_gate_admit_async(): the permit passed to the callback
/// belongs to the callback's owner (release it with lg_permit_release()
/// exactly once); on LG_OK *out_ticket owns a ticket (free it with
/// lg_ticket_free()); `user_data` must stay valid until the callback has
/// run or the request was cancelled.
/// Thread safety: any thread; `user_data` must be usable from the thread
/// the callback runs on. Blocking: never (lock-free; runs the callback of
/// a request it displaces on this thread; allocates the callback's box).
///
/// # Safety
/// `gate` is NULL or a live gate; `callback` is NULL or a function that is
/// safe to call with `user_data` from any thread; `out_ticket` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit_async_at(
    gate: *const lg_gate,
    priority: u8,
    callback: lg_admit_callback,
    user_data: *mut c_void,
    out_ticket: *mut *mut lg_ticket,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit_async(gate, priority, callback, user_data, out_ticket) }
}

/// lg_gate_admit_async_at(): the body of both asynchronous admits.
///
/// # Safety
/// As lg_gate_admit_async().
unsafe fn admit_async(
    gate: *const lg_gate,
    priority: u8,
    callback: lg_admit_callback,
    user_data: *mut c_void,
    out_ticket: *mut *mut lg_ticket,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let callback = callback.ok_or_else(|| Error::invalid("callback must not be NULL"))?;
        let out = Out::optional(out_ticket, "out_ticket")?;
        // SAFETY: the callback may be called with `user_data` from any thread
        // (contract).
        let target = unsafe { CallbackTarget::new(callback, user_data) };
        let ticket = g
            .gate
            .admit_with_callback_at(priority, Box::new(move |outcome| target.call(outcome)));
        if let Some(out) = out {
            // SAFETY: `out_ticket` is writable (contract).
            unsafe { out.write(lg_ticket::into_raw(ticket)) };
        }
        Ok(())
    })
}
