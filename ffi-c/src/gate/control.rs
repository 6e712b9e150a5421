//! `lg_gate`'s controls: how many classes it has, changing its limit,
//! closing it, and driving its queue deadlines (lg_gate_expire(),
//! lg_gate_next_deadline()). Calls that change or drive a live gate rather
//! than admit to it.

use crate::ffi::{guard, input, Out};
use crate::status::lg_status;

use super::{lg_gate, LG_TIMEOUT_INFINITE};

/// How many priority classes the gate has: its lg_gate_config.class_count,
/// or 1 for a gate without classes (whose whole queue is class 0).
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_classes).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_classes` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_classes(
    gate: *const lg_gate,
    out_classes: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_classes, "out_classes")?;
        // SAFETY: `out_classes` is writable (contract).
        unsafe { out.write(g.gate.classes()) };
        Ok(())
    })
}

/// Changes the engine limit N (1 to 2097151). Raising it hands the new
/// slots to waiters before returning (their callbacks run on this thread);
/// lowering it revokes nothing: running requests finish and the count
/// drains down.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate, limit 0 or too large).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the gate's limit lock
/// briefly (only limit changes take it); runs asynchronous callbacks of
/// granted waiters.
///
/// # Safety
/// `gate` is NULL or a live gate.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_set_limit(gate: *const lg_gate, limit: u32) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        g.gate.set_limit(limit)?;
        Ok(())
    })
}

/// Closes the gate: every queued request and every later admission gets
/// LG_CLOSED. Permits already held stay valid. Closing twice is harmless.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free; it may wait a
/// few instructions for an arrival on its way into the queue); wakes
/// blocked waiters and runs the callbacks of queued asynchronous requests
/// on this thread.
///
/// # Safety
/// `gate` is NULL or a live gate.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_close(gate: *const lg_gate) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        g.gate.close();
        Ok(())
    })
}

/// Rejects every queued request past the queue deadline (on a gate with
/// classes, its class's) with LG_QUEUE_TIMEOUT. A no-op without a
/// deadline. `out_expired` (may be NULL) receives how many were rejected.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free); runs the
/// callbacks of expired asynchronous requests on this thread.
///
/// # Safety
/// `gate` is NULL or a live gate; `out_expired` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_expire(
    gate: *const lg_gate,
    out_expired: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::optional(out_expired, "out_expired")?;
        let n = g.gate.expire();
        if let Some(out) = out {
            // SAFETY: `out_expired` is writable (contract).
            unsafe { out.write(n) };
        }
        Ok(())
    })
}

/// How long, in nanoseconds from now, until the next queued request passes
/// the queue deadline (on a gate with classes, its class's; 0 if one
/// already has): the time at which an event loop should call
/// lg_gate_expire(). LG_TIMEOUT_INFINITE when there is no deadline or
/// nobody is queued.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_wait_ns).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_wait_ns` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_next_deadline(
    gate: *const lg_gate,
    out_wait_ns: *mut u64,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_wait_ns, "out_wait_ns")?;
        let wait = g
            .gate
            .time_to_next_deadline()
            .map_or(LG_TIMEOUT_INFINITE, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(LG_TIMEOUT_INFINITE)
            });
        // SAFETY: `out_wait_ns` is writable (contract).
        unsafe { out.write(wait) };
        Ok(())
    })
}
