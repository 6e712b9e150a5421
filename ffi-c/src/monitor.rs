//! `lg_monitor`: the frontend monitor (load table, busy rule, router).
//!
//! This file holds the handle, the C types and constants of the monitor and
//! its construction (lg_monitor_config_default(), lg_monitor_new(),
//! lg_monitor_free()); the other calls live in the submodules, one concern
//! each: `load` (workers and their load reports), `rules` (thresholds,
//! staleness and the sweep), `select` (busy and lease queries, routing)
//! and `telemetry` (the metrics text). cbindgen emits this file's
//! functions first and then each submodule's in the order they are declared
//! here, which is the header's order.

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use loadgate_core::monitor::{ModelDefaults, Monitor, MonitorConfig, Staleness};
use loadgate_core::thresholds::{ThresholdField, ThresholdFields};
use loadgate_core::{Limits, LoadReport, MonotonicClock, WorkerSpec};

use crate::ffi::{guard, optional, optional_string, Error, Out};
use crate::status::lg_status;

mod load;
mod rules;
mod select;
mod slo;
mod telemetry;

pub use load::*;
pub use rules::*;
pub use select::*;
pub use slo::*;
pub use telemetry::*;

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
    /// Whether every model's default thresholds come from Dynamo's
    /// DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD, DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD
    /// and DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC, read when the monitor
    /// is made (default false).
    pub dynamo_env: bool,
    /// How lg_monitor_dispatch() picks a worker for a model without flow
    /// control: one of LG_POLICY_* (default LG_POLICY_ROUND_ROBIN).
    pub routing: lg_policy,
    /// How many times lg_monitor_redispatch() routes a request a worker
    /// refused to another worker, for a model without flow control
    /// (default 1; at most 16).
    pub reroutes: u32,
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
    /// Whether max_num_seqs is given.
    pub has_max_num_seqs: bool,
    /// Requests every rank's engine runs at once at most (its
    /// max_num_seqs; 0 is taken as not known). With an SLO set
    /// (lg_monitor_set_slo()), a rank's learned seats never pass it.
    pub max_num_seqs: u64,
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
    /// Whether max_num_seqs is present.
    pub has_max_num_seqs: bool,
    /// Requests the engine runs at once at most (its max_num_seqs; 0 is
    /// taken as not known).
    pub max_num_seqs: u64,
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
            max_num_seqs: some_if(self.has_max_num_seqs, self.max_num_seqs),
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
            max_num_seqs: some_if(self.has_max_num_seqs, self.max_num_seqs),
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
            dynamo_env: false,
            routing: LG_POLICY_ROUND_ROBIN,
            reroutes: d.reroutes,
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
/// bad staleness or routing policy, reroutes over 16, metrics prefix not matching [a-zA-Z_:][a-zA-Z0-9_:]*, a
/// malformed DYN_ACTIVE_* variable with dynamo_env: the message names it
/// and its value).
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
                    routing: policy(c.routing)?,
                    reroutes: c.reroutes,
                    ..MonitorConfig::default()
                };
                if c.dynamo_env {
                    config.defaults = ModelDefaults::from_env()?;
                }
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
