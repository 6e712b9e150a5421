//! `lg_monitor`'s router: whether a worker is busy or leased, picking a
//! worker of a model (lg_monitor_select(), lg_monitor_select_min_cost()),
//! checking a pinned one and marking one overloaded. The per-request calls
//! of a frontend.

use std::ffi::c_char;

use loadgate_core::monitor::Policy;

use crate::ffi::{guard, input, slice, string, Error, Out};
use crate::status::lg_status;

use super::{
    lg_monitor, lg_policy, LG_POLICY_POWER_OF_TWO, LG_POLICY_RANDOM, LG_POLICY_ROUND_ROBIN,
};

pub(crate) fn policy(p: lg_policy) -> Result<Policy, Error> {
    match p {
        LG_POLICY_ROUND_ROBIN => Ok(Policy::RoundRobin),
        LG_POLICY_RANDOM => Ok(Policy::Random),
        LG_POLICY_POWER_OF_TWO => Ok(Policy::PowerOfTwo),
        other => Err(Error::invalid(format_args!(
            "policy {other} is not one of LG_POLICY_ROUND_ROBIN (0), LG_POLICY_RANDOM (1), \
             LG_POLICY_POWER_OF_TWO (2)"
        ))),
    }
}

/// Whether a worker is busy by its model's thresholds (leases aside).
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_busy), LG_NOT_FOUND
/// (unknown worker).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `out_busy` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_is_busy(
    monitor: *const lg_monitor,
    worker_id: u64,
    out_busy: *mut bool,
) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        let out = Out::new(out_busy, "out_busy")?;
        let busy = m.monitor.is_busy(worker_id)?;
        // SAFETY: writable by the contract.
        unsafe { out.write(busy) };
        Ok(())
    })
}

/// Whether a worker is under an unexpired overload lease.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_leased), LG_NOT_FOUND
/// (unknown worker).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `out_leased` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_is_leased(
    monitor: *const lg_monitor,
    worker_id: u64,
    out_leased: *mut bool,
) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        let out = Out::new(out_leased, "out_leased")?;
        let leased = m.monitor.is_leased(worker_id)?;
        // SAFETY: writable by the contract.
        unsafe { out.write(leased) };
        Ok(())
    })
}

/// Picks a worker of `model` that is not busy and not under an overload
/// lease, by `policy` (LG_POLICY_*).
///
/// Errors: LG_OVERLOADED (workers registered, none eligible; counted as a
/// rejection), LG_UNAVAILABLE (no worker registered, or unknown model),
/// LG_INVALID_ARGUMENT (NULL monitor or out_worker_id, bad model string,
/// unknown policy).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free, no allocation).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `out_worker_id` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_select(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    policy: lg_policy,
    out_worker_id: *mut u64,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        let out = Out::new(out_worker_id, "out_worker_id")?;
        let id = m.monitor.select(model, self::policy(policy)?)?;
        // SAFETY: writable by the contract.
        unsafe { out.write(id) };
        Ok(())
    })
}

/// Picks the eligible worker of `model` with the lowest caller-given cost
/// (for KV-overlap routers): `worker_ids[i]` costs `costs[i]`, for i below
/// `count`. Candidates that are unknown, of another model, busy or leased
/// are skipped; NaN costs rank last; ties keep the first.
///
/// Errors: LG_OVERLOADED (no candidate eligible; counted), LG_UNAVAILABLE
/// (no worker registered, or unknown model), LG_INVALID_ARGUMENT (NULL
/// monitor or out_worker_id, NULL arrays with count > 0, bad model string).
/// Ownership: the arrays are only read during the call.
/// Thread safety: any thread. Blocking: never (lock-free, no allocation).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `worker_ids` and `costs` are NULL or valid for `count`
/// elements; `out_worker_id` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_select_min_cost(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    worker_ids: *const u64,
    costs: *const f64,
    count: usize,
    out_worker_id: *mut u64,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        // SAFETY: `worker_ids` is NULL or valid for `count` elements (contract).
        let ids = unsafe { slice(worker_ids, count, "worker_ids") }?;
        // SAFETY: `costs` is NULL or valid for `count` elements (contract).
        let costs = unsafe { slice(costs, count, "costs") }?;
        let out = Out::new(out_worker_id, "out_worker_id")?;
        let id = m
            .monitor
            .select_min_cost(model, ids.iter().copied().zip(costs.iter().copied()))?;
        // SAFETY: writable by the contract.
        unsafe { out.write(id) };
        Ok(())
    })
}

/// Checks a pinned worker before sending it a request.
///
/// Errors: LG_WORKER_OVERLOADED (busy or under a lease; counted as a
/// rejection), LG_NOT_FOUND (unknown worker), LG_INVALID_ARGUMENT (NULL
/// monitor).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `monitor` is NULL or a live monitor.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_check(monitor: *const lg_monitor, worker_id: u64) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        m.monitor.check(worker_id)?;
        Ok(())
    })
}

/// Marks a worker that refused a request with "Server overloaded: ...": it
/// is skipped for the lease time, or until its next load report shows it
/// not busy. Marking again extends the lease.
///
/// Errors: LG_NOT_FOUND (unknown worker), LG_INVALID_ARGUMENT (NULL
/// monitor).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `monitor` is NULL or a live monitor.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_mark_overloaded(
    monitor: *const lg_monitor,
    worker_id: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        m.monitor.mark_overloaded(worker_id)?;
        Ok(())
    })
}
