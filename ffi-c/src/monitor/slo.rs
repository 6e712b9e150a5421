//! `lg_monitor`'s SLO: a model's targets, the streams its bookings observe
//! (lg_booking_first_token(), lg_booking_tokens(), lg_booking_finish()),
//! the answers they reserve (lg_booking_expect_output()), what each rank's
//! fitted step time predicts for a new request, and what its verdicts
//! decided while advisory.

use std::ffi::c_char;

use loadgate_core::monitor::SloMode;
use loadgate_core::slo::Slo;

use crate::booking::lg_booking;
use crate::ffi::{boundary, guard, input, string, Error, Out};
use crate::status::lg_status;

use super::lg_monitor;

/// A model's service-level objective, in seconds.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_slo {
    /// Time to first token: finite, above 0, at most 3600.
    pub ttft_seconds: f64,
    /// Time per output token after the first: the same bounds.
    pub tpot_seconds: f64,
    /// Whether the SLO's verdicts are only counted and shown (true) or
    /// mark ranks busy beside the thresholds (false).
    pub advisory: bool,
}

/// What a rank's fitted step time predicts for a new request there now.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_prediction {
    /// Time to its first token, seconds.
    pub ttft_seconds: f64,
    /// Time per output token once admitted, seconds.
    pub tpot_seconds: f64,
    /// Whether the rank's fit has enough observations within its error;
    /// an untrusted prediction is shown, never acted on.
    pub trusted: bool,
    /// Running relative error of the rank's step-time fit (1 until
    /// observed).
    pub fit_error: f64,
    /// Running relative error of its time-to-first-token predictions (1
    /// until observed).
    pub ttft_error: f64,
}

/// Sets (`slo` non-NULL) or clears (NULL) the SLO of `model`. Its
/// bookings' streams are observed (lg_booking_first_token(),
/// lg_booking_tokens(), lg_booking_finish()), each rank's engine step time
/// is fitted, bookings reserve the answers they expect, and each rank gets
/// the SLO's verdict, which marks it busy beside the thresholds, or with
/// `advisory` is only counted (lg_monitor_slo_counts()) and shown.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, bad model string, a field
/// not finite, not above 0 or above 3600 seconds, named in the message),
/// LG_NOT_FOUND (unknown model). A refused call changes nothing.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (may start the monitor's
/// maintenance thread).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `slo` is NULL or points to a valid lg_slo.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_set_slo(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    slo: *const lg_slo,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        // SAFETY: `slo` is NULL or a valid lg_slo (contract).
        let (slo, mode) = match unsafe { slo.as_ref() } {
            Some(s) => (
                Some(
                    Slo::from_secs(s.ttft_seconds, s.tpot_seconds)
                        .map_err(|e| Error::invalid(format_args!("slo: {e}")))?,
                ),
                if s.advisory {
                    SloMode::Advisory
                } else {
                    SloMode::Enforce
                },
            ),
            None => (None, SloMode::Enforce),
        };
        m.monitor.set_slo(model, slo, mode)?;
        Ok(())
    })
}

/// What a model's SLO decided, and would have decided while advisory
/// (lg_monitor_slo_counts()).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct lg_slo_counts {
    /// Requests picked while advisory whose worker the SLO would admit.
    pub would_admit: u64,
    /// Requests that found no worker free while advisory and that the SLO
    /// would have let wait in the queue.
    pub would_queue: u64,
    /// Requests picked while advisory whose worker the SLO would refuse,
    /// and requests it would have refused a wait in the queue.
    pub would_refuse: u64,
    /// Requests refused at arrival, enforced, because their wait in the
    /// queue was predicted past their deadline or the TTFT target.
    pub refused_late: u64,
}

/// What `model`'s SLO decided, and would have decided while advisory,
/// into `*out`.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or output, bad model string),
/// LG_NOT_FOUND (unknown model).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `out` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_slo_counts(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    out: *mut lg_slo_counts,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        let out = Out::new(out, "out")?;
        let c = m.monitor.slo_counts(model).ok_or_else(|| {
            Error::new(
                lg_status::LG_NOT_FOUND,
                format_args!("unknown model {model:?}"),
            )
        })?;
        let counts = lg_slo_counts {
            would_admit: c.would_admit,
            would_queue: c.would_queue,
            would_refuse: c.would_refuse,
            refused_late: c.refused_late,
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(counts) };
        Ok(())
    })
}

/// What rank `dp_rank` of `worker_id` would give a new request of
/// `prompt_tokens` now, from its fitted step time.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_prediction),
/// LG_NOT_FOUND (unknown worker or undeclared rank).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the rank's fit lock briefly
/// (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `out_prediction` is NULL or valid
/// for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_predict(
    monitor: *const lg_monitor,
    worker_id: u64,
    dp_rank: u32,
    prompt_tokens: u64,
    out_prediction: *mut lg_prediction,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        let out = Out::new(out_prediction, "out_prediction")?;
        let p = m.monitor.predict(worker_id, dp_rank, prompt_tokens)?;
        let (fit_error, ttft_error) = m.monitor.prediction_errors(worker_id, dp_rank)?;
        let prediction = lg_prediction {
            ttft_seconds: p.ttft,
            tpot_seconds: p.tpot,
            trusted: p.trusted,
            fit_error,
            ttft_error,
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(prediction) };
        Ok(())
    })
}

/// The request's first token came: its prefill is done (as
/// lg_booking_prefill_done()) and, with an SLO set for its model, the time
/// since it was booked is observed as its time to first token. Calling it
/// again only marks the prefill done.
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
pub unsafe extern "C" fn lg_booking_first_token(booking: *mut lg_booking) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by this thread alone (contract).
        let b = unsafe { lg_booking::get_mut(booking) }?;
        b.first_token();
        Ok(())
    })
}

/// `n` more tokens of the answer came, after the first: its reservation
/// settles (lg_booking_expect_output()) and, with an SLO set for its model,
/// the time since the last token, over `n`, is observed as one engine step
/// of its rank. Before lg_booking_first_token(), or for `n` of 0, it does
/// nothing.
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
pub unsafe extern "C" fn lg_booking_tokens(booking: *mut lg_booking, n: u64) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by this thread alone (contract).
        let b = unsafe { lg_booking::get_mut(booking) }?;
        b.tokens(n);
        Ok(())
    })
}

/// Reserves KV for the answer to come, up to `max_tokens` tokens (the
/// request's limit; 0: as long as the model's answers go), settling as
/// tokens stream (lg_booking_tokens()). With an SLO set for its model every
/// booking already reserves, unbounded; this bounds it.
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
pub unsafe extern "C" fn lg_booking_expect_output(
    booking: *mut lg_booking,
    max_tokens: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by this thread alone (contract).
        let b = unsafe { lg_booking::get_mut(booking) }?;
        b.expect_output((max_tokens != 0).then_some(max_tokens));
        Ok(())
    })
}

/// Blocks reserved now for the answer (part of lg_booking_blocks()).
///
/// Errors: LG_INVALID_ARGUMENT (NULL booking or out_blocks).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: one thread at a time per booking. Blocking: never.
///
/// # Safety
/// `booking` is NULL or a live booking; `out_blocks` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_reserved_blocks(
    booking: *mut lg_booking,
    out_blocks: *mut u64,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, used by this thread alone (contract).
        let b = unsafe { lg_booking::get_mut(booking) }?;
        let out = Out::new(out_blocks, "out_blocks")?;
        // SAFETY: writable by the contract.
        unsafe { out.write(b.reserved_blocks()) };
        Ok(())
    })
}

/// The answer ended with `output_tokens` tokens (UINT64_MAX: as many as
/// lg_booking_first_token() and lg_booking_tokens() counted): with an SLO
/// set for its model, its length is learned for the reservations of the
/// answers to come, and its time per output token is weighed against the
/// TPOT target (the rank's TPOT margin). Frees the booking, as
/// lg_booking_free(); NULL is a no-op.
///
/// Ownership: takes `booking`.
/// Thread safety: any thread, but no other thread may be using the booking.
/// Blocking: never (lock-free).
///
/// # Safety
/// `booking` is NULL or was returned by lg_monitor_book() and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_booking_finish(booking: *mut lg_booking, output_tokens: u64) {
    boundary((), || {
        if !booking.is_null() {
            // SAFETY: a live handle, given up by the caller (contract).
            let b = *unsafe { Box::from_raw(booking) };
            b.into_inner()
                .finish((output_tokens != u64::MAX).then_some(output_tokens));
        }
    })
}
