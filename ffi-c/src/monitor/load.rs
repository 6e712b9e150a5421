//! `lg_monitor`'s workers and their load: declaring and removing workers
//! (lg_monitor_add_worker(), lg_monitor_remove_worker()) and applying a
//! rank's load report (lg_monitor_report()). The calls that feed the load
//! table, apart from the rules that judge it.

use std::ffi::c_char;

use loadgate_core::WorkerSpec;

use crate::ffi::{guard, input, optional, string};
use crate::status::lg_status;

use super::{lg_load_report, lg_monitor, lg_worker_spec};

/// Registers worker `worker_id` of `model` with the ranks and capacities of
/// `spec` (NULL: one rank, 0..1, capacities unknown). The model is created
/// on its first worker and keeps its thresholds while workers come and go.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, empty or non-UTF-8 model,
/// dp_start + dp_size overflowing), LG_ALREADY_EXISTS (worker_id taken),
/// LG_MODEL_FULL (max_workers_per_model reached).
/// Ownership: `model` is copied.
/// Thread safety: any thread. Blocking: takes the monitor's writer lock
/// briefly (cold path; allocates).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` is NULL or valid for
/// `model_len` bytes; `spec` is NULL or points to a valid lg_worker_spec.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_add_worker(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    worker_id: u64,
    spec: *const lg_worker_spec,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `model` is NULL or valid for `model_len` bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        // SAFETY: `spec` is NULL or a valid lg_worker_spec (contract).
        let spec = unsafe { optional(spec, "spec") }?;
        let spec = spec.map_or_else(WorkerSpec::default, lg_worker_spec::core_spec);
        m.monitor.add_worker(model, worker_id, spec)?;
        Ok(())
    })
}

/// Unregisters a worker: it leaves the busy set and the metrics at once;
/// bookings on it become no-ops.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor), LG_NOT_FOUND (unknown
/// worker).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the monitor's writer lock
/// briefly (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_remove_worker(
    monitor: *const lg_monitor,
    worker_id: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        m.monitor.remove_worker(worker_id)?;
        Ok(())
    })
}

/// Applies one load report to rank `dp_rank` of a worker and re-evaluates
/// the worker's busy state before returning. Absent fields keep their
/// value; a present 0 overwrites. A report that leaves the worker not busy
/// ends its overload lease.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or report,
/// active_prefill_tokens of UINT64_MAX), LG_NOT_FOUND (unknown worker or
/// undeclared rank). A refused report changes nothing and is counted.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free, no allocation).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `report` is NULL or points to a
/// valid lg_load_report.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_report(
    monitor: *const lg_monitor,
    worker_id: u64,
    dp_rank: u32,
    report: *const lg_load_report,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `report` is NULL or a valid lg_load_report (contract).
        let r = unsafe { input(report, "report") }?;
        m.monitor.report(worker_id, dp_rank, &r.core_report())?;
        Ok(())
    })
}
