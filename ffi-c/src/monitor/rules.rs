//! `lg_monitor`'s busy rule: a model's thresholds (set, cleared, read) and
//! its staleness policy, and the sweep that applies staleness and ends
//! overload leases. The calls that change how the load table is judged.

use std::ffi::c_char;
use std::time::Duration;

use loadgate_core::thresholds::{ThresholdFields, ThresholdUpdate};

use crate::ffi::{guard, input, string, Error, Out};
use crate::status::lg_status;

use super::{lg_monitor, lg_staleness, lg_threshold_update, lg_thresholds, some_if, staleness};

fn thresholds_out(state: loadgate_core::monitor::ThresholdState) -> lg_thresholds {
    let t = state.thresholds;
    lg_thresholds {
        has_active_decode_blocks_threshold: t.active_decode_blocks_threshold.is_some(),
        active_decode_blocks_threshold: t.active_decode_blocks_threshold.unwrap_or(0.0),
        has_active_prefill_tokens_threshold: t.active_prefill_tokens_threshold.is_some(),
        active_prefill_tokens_threshold: t.active_prefill_tokens_threshold.unwrap_or(0),
        has_active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac.is_some(),
        active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac.unwrap_or(0.0),
        version: state.version,
        has_waiting_requests_threshold: t.waiting_requests_threshold.is_some(),
        waiting_requests_threshold: t.waiting_requests_threshold.unwrap_or(0),
    }
}

/// The core update an lg_threshold_update asks for.
fn update_of(u: &lg_threshold_update) -> Result<ThresholdUpdate, Error> {
    let clear = ThresholdFields::from_bits(u.clear).map_err(|unknown| {
        Error::invalid(format_args!(
            "clear has unknown bits {unknown:#x} (use LG_CLEAR_* flags)"
        ))
    })?;
    Ok(ThresholdUpdate {
        active_decode_blocks_threshold: some_if(
            u.has_active_decode_blocks_threshold,
            u.active_decode_blocks_threshold,
        ),
        active_prefill_tokens_threshold: some_if(
            u.has_active_prefill_tokens_threshold,
            u.active_prefill_tokens_threshold,
        ),
        active_prefill_tokens_threshold_frac: some_if(
            u.has_active_prefill_tokens_threshold_frac,
            u.active_prefill_tokens_threshold_frac,
        ),
        waiting_requests_threshold: some_if(
            u.has_waiting_requests_threshold,
            u.waiting_requests_threshold,
        ),
        clear,
    })
}

/// Sets the thresholds every model created from now on starts with (an
/// update applied to the current defaults, as lg_monitor_set_thresholds()
/// applies one to a model); models that exist keep theirs.
/// `out_thresholds` (may be NULL) receives the defaults in force
/// afterwards (version 0).
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or update, a value out of
/// range as for lg_monitor_set_thresholds()). A refused update changes
/// nothing.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the defaults' lock (cold
/// path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `update` is NULL or points to a
/// valid lg_threshold_update; `out_thresholds` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_set_default_thresholds(
    monitor: *const lg_monitor,
    update: *const lg_threshold_update,
    out_thresholds: *mut lg_thresholds,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `update` is NULL or a valid lg_threshold_update (contract).
        let u = unsafe { input(update, "update") }?;
        let out = Out::optional(out_thresholds, "out_thresholds")?;
        let thresholds = m.monitor.set_default_thresholds(&update_of(u)?)?;
        if let Some(out) = out {
            let state = loadgate_core::monitor::ThresholdState {
                thresholds,
                version: 0,
            };
            // SAFETY: writable by the contract.
            unsafe { out.write(thresholds_out(state)) };
        }
        Ok(())
    })
}

/// Validates and applies a threshold update to `model`, bumps its version
/// and re-evaluates every worker of the model before returning. An update
/// that sets and clears nothing is a read. `out_thresholds` (may be NULL)
/// receives the thresholds in force afterwards.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or update, bad model string,
/// NaN, infinite, negative or > 1 decode threshold, NaN, infinite or
/// negative fraction, unknown clear bits, a field both set and cleared),
/// LG_NOT_FOUND (no worker of the model was ever added). A refused update
/// changes nothing.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the model's lock and waits
/// for the re-evaluation of its workers (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `update` is NULL or points to a valid
/// lg_threshold_update; `out_thresholds` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_set_thresholds(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    update: *const lg_threshold_update,
    out_thresholds: *mut lg_thresholds,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        // SAFETY: `update` is NULL or a valid lg_threshold_update (contract).
        let u = unsafe { input(update, "update") }?;
        let out = Out::optional(out_thresholds, "out_thresholds")?;
        let update = update_of(u)?;
        let state = m.monitor.set_thresholds(model, &update)?;
        if let Some(out) = out {
            // SAFETY: writable by the contract.
            unsafe { out.write(thresholds_out(state)) };
        }
        Ok(())
    })
}

/// Reads the thresholds of `model`.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_thresholds, bad model
/// string), LG_NOT_FOUND (unknown model).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the model's lock briefly.
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `out_thresholds` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_get_thresholds(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    out_thresholds: *mut lg_thresholds,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        let out = Out::new(out_thresholds, "out_thresholds")?;
        let state = m.monitor.thresholds(model).ok_or_else(|| {
            Error::new(
                lg_status::LG_NOT_FOUND,
                format_args!("unknown model {model:?}"),
            )
        })?;
        // SAFETY: writable by the contract.
        unsafe { out.write(thresholds_out(state)) };
        Ok(())
    })
}

/// Sets the staleness policy of `model` (LG_STALENESS_*) and the silence
/// after which a rank is stale, then sweeps.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, bad model string, unknown
/// policy, stale_after_ms of 0), LG_NOT_FOUND (unknown model).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: waits for the sweep (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_set_staleness(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    policy: lg_staleness,
    stale_after_ms: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        let policy = staleness(policy)?;
        m.monitor
            .set_staleness(model, policy, Duration::from_millis(stale_after_ms))?;
        Ok(())
    })
}

/// The sweep, now: marks ranks silent for stale_after as stale (models
/// whose policy is not keep), re-evaluates the workers whose state changed
/// and ends expired overload leases. The monitor's maintenance thread
/// sweeps by itself (at a quarter of stale_after, at least every second);
/// this is for a check on demand. `out_changed` (may be NULL) receives the
/// number of workers re-evaluated.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: waits for re-evaluations (cold
/// path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `out_changed` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_sweep(
    monitor: *const lg_monitor,
    out_changed: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        let out = Out::optional(out_changed, "out_changed")?;
        let changed = m.monitor.sweep();
        if let Some(out) = out {
            // SAFETY: writable by the contract.
            unsafe { out.write(changed) };
        }
        Ok(())
    })
}
