//! `lg_monitor`: the frontend monitor (load table, busy rule, router).

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use loadgate_core::monitor::{Monitor, MonitorConfig, Policy, Staleness};
use loadgate_core::thresholds::{ThresholdField, ThresholdFields, ThresholdUpdate};
use loadgate_core::{Limits, LoadReport, MonotonicClock, WorkerSpec};

use crate::ffi::{guard, input, optional, optional_string, slice, string, Error, Out, TextBuf};
use crate::status::lg_status;

/// A frontend monitor: every worker's per-rank load, the busy rule, and the
/// router. Opaque; create with lg_monitor_new(), free with
/// lg_monitor_free().
///
/// Every function taking a `const lg_monitor *` may be called from any
/// number of threads at once.
pub struct lg_monitor {
    /// Shared with the subscriptions fed into it (lg_monitor_subscribe_nats),
    /// which may outlive the handle.
    pub(crate) monitor: Arc<Monitor>,
}

/// A routing policy for lg_monitor_select(): one of LG_POLICY_*.
#[allow(non_camel_case_types)]
pub type lg_policy = u32;
/// Each eligible worker in turn (approximate under concurrent selects).
pub const LG_POLICY_ROUND_ROBIN: lg_policy = 0;
/// Uniformly random among eligible workers.
pub const LG_POLICY_RANDOM: lg_policy = 1;
/// Two random eligible workers; the less loaded one wins.
pub const LG_POLICY_POWER_OF_TWO: lg_policy = 2;

/// What a rank that stopped reporting counts as: one of LG_STALENESS_*.
#[allow(non_camel_case_types)]
pub type lg_staleness = u32;
/// Keep its last values (the reference behaviour; the default).
pub const LG_STALENESS_KEEP: lg_staleness = 0;
/// Count it as free once silent for stale_after.
pub const LG_STALENESS_FREE: lg_staleness = 1;
/// Count it as busy once silent for stale_after.
pub const LG_STALENESS_BUSY: lg_staleness = 2;

/// Clear flag of lg_threshold_update: unset active_decode_blocks_threshold.
pub const LG_CLEAR_ACTIVE_DECODE_BLOCKS_THRESHOLD: u32 = 1;
/// Clear flag of lg_threshold_update: unset active_prefill_tokens_threshold.
pub const LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD: u32 = 2;
/// Clear flag of lg_threshold_update: unset
/// active_prefill_tokens_threshold_frac.
pub const LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC: u32 = 4;
/// Clear flag of lg_threshold_update: unset waiting_requests_threshold.
pub const LG_CLEAR_WAITING_REQUESTS_THRESHOLD: u32 = 8;

// The flags are the bits of core's field set, which parses them.
const _: () = {
    const fn names(flag: u32, field: ThresholdField) -> bool {
        match ThresholdFields::from_bits(flag) {
            Ok(set) => flag.count_ones() == 1 && set.contains(field),
            Err(_) => false,
        }
    }
    assert!(names(
        LG_CLEAR_ACTIVE_DECODE_BLOCKS_THRESHOLD,
        ThresholdField::ActiveDecodeBlocks
    ));
    assert!(names(
        LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD,
        ThresholdField::ActivePrefillTokens
    ));
    assert!(names(
        LG_CLEAR_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC,
        ThresholdField::ActivePrefillTokensFrac
    ));
    assert!(names(
        LG_CLEAR_WAITING_REQUESTS_THRESHOLD,
        ThresholdField::WaitingRequests
    ));
};

/// Monitor settings. Fill with lg_monitor_config_default(), then change
/// fields; a zeroed struct is invalid (zero lease).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_monitor_config {
    /// How long a worker marked overloaded is skipped, in milliseconds
    /// (default 1000; must be > 0).
    pub lease_ms: u64,
    /// Silence after which a rank is stale, in milliseconds (default 3000;
    /// must be > 0).
    pub stale_after_ms: u64,
    /// Staleness policy of new models (default LG_STALENESS_KEEP).
    pub staleness: lg_staleness,
    /// Most workers one model can hold (default 4096; 1 to 16777216).
    pub max_workers_per_model: usize,
    /// Metric name prefix, not NUL-terminated; NULL (with length 0) for the
    /// default "dynamo". Copied.
    pub metrics_prefix: *const c_char,
    /// Length of metrics_prefix in bytes.
    pub metrics_prefix_len: usize,
    /// Most models the monitor holds (default 256; at least 1). A model
    /// with no workers and no settings of its own makes room for a new one.
    pub max_models: usize,
    /// Most workers the monitor holds over all models (default 16384; at
    /// least 1).
    pub max_workers: usize,
    /// Most ranks one worker declares (default 1024; at least 1).
    pub max_ranks_per_worker: u32,
    /// Most ranks the monitor holds over all workers (default 65536; at
    /// least 1).
    pub max_ranks: usize,
    /// Longest model name in bytes (default 256; at least 1).
    pub max_name_len: usize,
}

/// How a worker is declared. A zeroed struct declares no ranks (such a
/// worker is never busy); pass NULL to lg_monitor_add_worker() for the
/// default of one rank, 0..1.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_worker_spec {
    /// First data-parallel rank.
    pub dp_start: u32,
    /// Number of ranks: the worker has ranks dp_start .. dp_start + dp_size.
    pub dp_size: u32,
    /// Whether kv_total_blocks is given.
    pub has_kv_total_blocks: bool,
    /// KV cache capacity of every rank.
    pub kv_total_blocks: u64,
    /// Whether max_num_batched_tokens is given.
    pub has_max_num_batched_tokens: bool,
    /// Prefill batch capacity of every rank.
    pub max_num_batched_tokens: u64,
}

/// One load report for one rank. A field whose has_ flag is false keeps its
/// previous value; a present 0 overwrites.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_load_report {
    /// Whether active_decode_blocks is present.
    pub has_active_decode_blocks: bool,
    /// Router-side active decode blocks.
    pub active_decode_blocks: u64,
    /// Whether kv_used_blocks is present.
    pub has_kv_used_blocks: bool,
    /// KV cache blocks in use.
    pub kv_used_blocks: u64,
    /// Whether kv_total_blocks is present.
    pub has_kv_total_blocks: bool,
    /// KV cache capacity.
    pub kv_total_blocks: u64,
    /// Whether active_prefill_tokens is present.
    pub has_active_prefill_tokens: bool,
    /// Prefill tokens in flight (UINT64_MAX is refused).
    pub active_prefill_tokens: u64,
    /// Whether max_num_batched_tokens is present.
    pub has_max_num_batched_tokens: bool,
    /// Prefill batch capacity.
    pub max_num_batched_tokens: u64,
    /// Whether waiting_requests is present.
    pub has_waiting_requests: bool,
    /// Requests waiting in the engine's queue (UINT64_MAX is refused).
    pub waiting_requests: u64,
}

impl lg_load_report {
    /// The core report: absent fields are `None`.
    #[inline]
    pub(crate) fn core_report(&self) -> LoadReport {
        LoadReport {
            active_decode_blocks: some_if(self.has_active_decode_blocks, self.active_decode_blocks),
            kv_used_blocks: some_if(self.has_kv_used_blocks, self.kv_used_blocks),
            kv_total_blocks: some_if(self.has_kv_total_blocks, self.kv_total_blocks),
            active_prefill_tokens: some_if(
                self.has_active_prefill_tokens,
                self.active_prefill_tokens,
            ),
            max_num_batched_tokens: some_if(
                self.has_max_num_batched_tokens,
                self.max_num_batched_tokens,
            ),
            waiting_requests: some_if(self.has_waiting_requests, self.waiting_requests),
        }
    }
}

impl lg_worker_spec {
    /// The core declaration: absent capacities are `None`.
    pub(crate) fn core_spec(&self) -> WorkerSpec {
        WorkerSpec {
            dp_start: self.dp_start,
            dp_size: self.dp_size,
            kv_total_blocks: some_if(self.has_kv_total_blocks, self.kv_total_blocks),
            max_num_batched_tokens: some_if(
                self.has_max_num_batched_tokens,
                self.max_num_batched_tokens,
            ),
        }
    }
}

/// A partial threshold update: fields whose has_ flag is set are set, fields
/// named in clear are unset, the rest keep their value. Nothing set and
/// nothing cleared is a read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_threshold_update {
    /// Whether active_decode_blocks_threshold is given.
    pub has_active_decode_blocks_threshold: bool,
    /// Decode threshold: finite, in [0, 1].
    pub active_decode_blocks_threshold: f64,
    /// Whether active_prefill_tokens_threshold is given.
    pub has_active_prefill_tokens_threshold: bool,
    /// Absolute prefill threshold, in tokens.
    pub active_prefill_tokens_threshold: u64,
    /// Whether active_prefill_tokens_threshold_frac is given.
    pub has_active_prefill_tokens_threshold_frac: bool,
    /// Fractional prefill threshold: finite, >= 0 (above 1 is legal).
    pub active_prefill_tokens_threshold_frac: f64,
    /// Fields to unset: a bitwise OR of LG_CLEAR_* flags. A field may not be
    /// both set and cleared.
    pub clear: u32,
    /// Whether waiting_requests_threshold is given.
    pub has_waiting_requests_threshold: bool,
    /// Waiting-requests threshold: a rank that reported waiting requests is
    /// busy when they exceed it.
    pub waiting_requests_threshold: u64,
}

/// A model's thresholds and the version of the last update. A field whose
/// has_ flag is false is off (that check is disabled).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_thresholds {
    /// Whether the decode check is on.
    pub has_active_decode_blocks_threshold: bool,
    /// Decode threshold.
    pub active_decode_blocks_threshold: f64,
    /// Whether the absolute prefill check is on.
    pub has_active_prefill_tokens_threshold: bool,
    /// Absolute prefill threshold.
    pub active_prefill_tokens_threshold: u64,
    /// Whether the fractional prefill check is on.
    pub has_active_prefill_tokens_threshold_frac: bool,
    /// Fractional prefill threshold.
    pub active_prefill_tokens_threshold_frac: f64,
    /// Bumped by every update; 0 before the first.
    pub version: u64,
    /// Whether the waiting-requests check is on.
    pub has_waiting_requests_threshold: bool,
    /// Waiting-requests threshold.
    pub waiting_requests_threshold: u64,
}

fn policy(p: lg_policy) -> Result<Policy, Error> {
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

fn staleness(s: lg_staleness) -> Result<Staleness, Error> {
    match s {
        LG_STALENESS_KEEP => Ok(Staleness::Keep),
        LG_STALENESS_FREE => Ok(Staleness::Free),
        LG_STALENESS_BUSY => Ok(Staleness::Busy),
        other => Err(Error::invalid(format_args!(
            "staleness {other} is not one of LG_STALENESS_KEEP (0), LG_STALENESS_FREE (1), \
             LG_STALENESS_BUSY (2)"
        ))),
    }
}

fn some_if<T>(present: bool, value: T) -> Option<T> {
    present.then_some(value)
}

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

/// Fills `out` with the default monitor settings.
///
/// Errors: LG_INVALID_ARGUMENT if out is NULL.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out` is NULL or valid for writes of an lg_monitor_config.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_config_default(out: *mut lg_monitor_config) -> lg_status {
    guard(|| {
        let out = Out::new(out, "out")?;
        let d = MonitorConfig::default();
        let config = lg_monitor_config {
            lease_ms: d.lease.as_millis() as u64,
            stale_after_ms: d.stale_after.as_millis() as u64,
            staleness: LG_STALENESS_KEEP,
            max_workers_per_model: d.limits.max_workers_per_model,
            metrics_prefix: std::ptr::null(),
            metrics_prefix_len: 0,
            max_models: d.limits.max_models,
            max_workers: d.limits.max_workers,
            max_ranks_per_worker: d.limits.max_ranks_per_worker,
            max_ranks: d.limits.max_ranks,
            max_name_len: d.limits.max_name_len,
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(config) };
        Ok(())
    })
}

/// Creates a monitor. `config` may be NULL for the defaults.
///
/// Errors: LG_INVALID_ARGUMENT if out_monitor is NULL or a setting is
/// invalid (zero lease or stale_after, a limit out of range,
/// bad staleness, metrics prefix not matching [a-zA-Z_:][a-zA-Z0-9_:]*).
/// Ownership: on LG_OK *out_monitor owns a new monitor; free it with
/// lg_monitor_free(). The config is copied.
/// Thread safety: any thread. Blocking: never (allocates).
///
/// # Safety
/// `config` is NULL or points to a valid lg_monitor_config whose
/// metrics_prefix is NULL or valid for metrics_prefix_len bytes;
/// `out_monitor` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_new(
    config: *const lg_monitor_config,
    out_monitor: *mut *mut lg_monitor,
) -> lg_status {
    guard(|| {
        let out = Out::new(out_monitor, "out_monitor")?;
        // SAFETY: NULL or a valid config, by the contract.
        let config = match unsafe { optional(config, "config") }? {
            None => MonitorConfig::default(),
            Some(c) => {
                let mut config = MonitorConfig {
                    lease: Duration::from_millis(c.lease_ms),
                    staleness: staleness(c.staleness)?,
                    stale_after: Duration::from_millis(c.stale_after_ms),
                    limits: Limits {
                        max_models: c.max_models,
                        max_workers: c.max_workers,
                        max_workers_per_model: c.max_workers_per_model,
                        max_ranks_per_worker: c.max_ranks_per_worker,
                        max_ranks: c.max_ranks,
                        max_name_len: c.max_name_len,
                    },
                    ..MonitorConfig::default()
                };
                // SAFETY: NULL or valid for metrics_prefix_len bytes.
                if let Some(p) = unsafe {
                    optional_string(c.metrics_prefix, c.metrics_prefix_len, "metrics_prefix")
                }? {
                    config.metrics_prefix = p.to_owned();
                }
                config
            }
        };
        let monitor = Arc::new(Monitor::with_config(config, MonotonicClock::shared())?);
        let handle = Box::into_raw(Box::new(lg_monitor { monitor }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a monitor. NULL is a no-op.
///
/// Ownership: takes `monitor`. Outstanding bookings stay valid (free them
/// with lg_booking_free() as usual), and so do subscriptions made with
/// lg_monitor_subscribe_nats(): they keep feeding the monitor's state, now
/// unreachable, until lg_subscription_free().
/// Thread safety: no other thread may be using the monitor.
/// Blocking: never.
///
/// # Safety
/// `monitor` is NULL or was returned by lg_monitor_new() and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_free(monitor: *mut lg_monitor) {
    crate::ffi::boundary((), || {
        if !monitor.is_null() {
            // SAFETY: a live handle from lg_monitor_new(), given up by the
            // caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(monitor) });
        }
    })
}

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
        let clear = ThresholdFields::from_bits(u.clear).map_err(|unknown| {
            Error::invalid(format_args!(
                "clear has unknown bits {unknown:#x} (use LG_CLEAR_* flags)"
            ))
        })?;
        let update = ThresholdUpdate {
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
        };
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

/// The off-hot-path sweep: marks ranks silent for stale_after as stale
/// (models whose policy is not keep), re-evaluates the workers whose state
/// changed and ends expired overload leases. Call it periodically (every few
/// hundred milliseconds). `out_changed` (may be NULL) receives the number
/// of workers re-evaluated.
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

/// Writes the frontend metrics (Prometheus text format) into `buf` with
/// snprintf semantics: *out_needed receives the length of the whole text
/// (without the NUL) whether or not it fits; if `buf_len` is larger, the
/// text and a NUL are written and LG_OK is returned; otherwise as much as
/// fits plus a NUL is written (when buf_len > 0) and LG_BUFFER_TOO_SMALL is
/// returned. Call with buf NULL and buf_len 0 to learn the size; the text
/// can grow between calls, so retry on LG_BUFFER_TOO_SMALL.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_needed, NULL buf with
/// buf_len > 0), LG_BUFFER_TOO_SMALL.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes model locks and each running
/// scrape's locks briefly (a scrape holds its own while it reports);
/// allocates (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `buf` is NULL or valid for writes
/// of `buf_len` bytes; `out_needed` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_metrics(
    monitor: *const lg_monitor,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { input(monitor, "monitor") }?;
        let text = TextBuf::new(buf, buf_len, out_needed)?;
        let metrics = m.monitor.metrics_text();
        // SAFETY: buf and out_needed writable by the contract.
        unsafe { text.write(metrics.as_bytes()) }
    })
}
