//! `lg_gate`: the worker admission gate (N running + Q queued).
//!
//! This file holds the handle, the C types and constants of the gate and its
//! construction (lg_gate_config_default() to lg_gate_free()); the other
//! calls live in the submodules, one concern each: `admit` (the admit
//! calls), `control` (class count, limit, closing, queue deadlines) and
//! `stats` (stats and metrics). cbindgen emits this file's functions first
//! and then each submodule's in the order they are declared here, which is
//! the header's order.

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use loadgate_core::gate::{
    AdmissionGate, ClassConfig, ClassStats, GateConfig, DEFAULT_QUEUE_LIMIT, MAX_CLASSES,
};

use crate::ffi::{boundary, guard, input, optional_string, slice, Error, Out};
use crate::status::lg_status;

mod admit;
mod control;
mod stats;

pub use admit::*;
pub use control::*;
pub use stats::*;

/// "Wait as long as it takes" for lg_gate_admit(), and "no deadline" from
/// lg_gate_next_deadline().
pub const LG_TIMEOUT_INFINITE: u64 = u64::MAX;

/// Most priority classes a gate has (lg_gate_config.class_count), and the
/// length of lg_gate_stats.classes.
pub const LG_MAX_CLASSES: usize = 8;

// The header's constant is a literal (cbindgen cannot read core's).
const _: () = assert!(LG_MAX_CLASSES == MAX_CLASSES);

/// A worker's admission gate: at most N requests run and at most Q wait, at
/// any instant; the rest are rejected with "Server overloaded: worker at
/// capacity". Opaque; create with lg_gate_new() or lg_gate_from_env(), free
/// with lg_gate_free().
///
/// Every function taking a `const lg_gate *` may be called from any number
/// of threads at once. Permits and queued asynchronous requests keep the
/// gate's state alive, so the handle may be freed before they are done.
pub struct lg_gate {
    gate: Arc<AdmissionGate>,
}

/// Gate settings. Fill with lg_gate_config_default(), then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_config {
    /// Engine slots N: how many requests may run at once (1 to 2097151).
    pub limit: u32,
    /// Queue size Q: how many requests may wait (0 to 2097151; default 16).
    pub queue: u32,
    /// Queue deadline in milliseconds: a waiter queued this long is rejected
    /// with LG_QUEUE_TIMEOUT. 0 turns it off (the default).
    pub queue_timeout_ms: u64,
    /// After a deadline expiry, hand the next freed slot to the newest
    /// waiter instead of the oldest (once). Default false.
    pub adaptive_lifo: bool,
    /// Metric name prefix, not NUL-terminated; NULL (with length 0) for the
    /// default "dynamo". Copied.
    pub metrics_prefix: *const c_char,
    /// Length of metrics_prefix in bytes.
    pub metrics_prefix_len: usize,
    /// Wait limit W: at most W admitted requests without their first
    /// response (lg_permit_first_response()); admission needs a request
    /// slot and a wait slot. 1 to 2097151; 0 means no wait limit (the
    /// default).
    pub wait_limit: u32,
    /// Priority classes, class 0 the most important: class_count entries
    /// (at most LG_MAX_CLASSES), copied by lg_gate_new(). NULL (with
    /// class_count 0, the default) for none: the gate without classes.
    ///
    /// queue bounds the whole queue and each class has its own limit within
    /// it. A freed slot goes to the oldest waiter of the most important
    /// class that has one (and may use the slot, see lg_gate_class.reserved).
    /// An arrival that finds the whole queue full, its own class not full,
    /// displaces the newest waiter of the least important class less
    /// important than its own, which is rejected with LG_DISPLACED. With
    /// classes, each class's queue_timeout_ms applies to its waiters and the
    /// gate's queue_timeout_ms is not used.
    pub classes: *const lg_gate_class,
    /// Number of entries in classes (0 to LG_MAX_CLASSES; 0 = no classes).
    pub class_count: usize,
}

/// One priority class of a gate (see lg_gate_config.classes). A zeroed
/// struct is a class that never waits, without deadline or reserved slots.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_class {
    /// How many requests of this class may wait: at most the gate's queue
    /// size. 0: the class never waits (sheddable traffic); it is admitted
    /// only when a slot is free for it and rejected otherwise.
    pub queue: u32,
    /// Queue deadline of this class's waiters in milliseconds (rejected with
    /// LG_QUEUE_TIMEOUT). 0: none, they wait as long as it takes.
    pub queue_timeout_ms: u64,
    /// Reserved slots: the last `reserved` of the gate's limit slots go only
    /// to this class and more important ones, so class k may run while
    /// fewer than limit - r requests run, r being the largest reservation
    /// of a class more important than k. At most the limit (checked by
    /// lg_gate_new(); a later lg_gate_set_limit() below it leaves the less
    /// important classes no slot until the limit rises again).
    pub reserved: u32,
}

impl lg_gate_class {
    fn core_class(&self) -> ClassConfig {
        ClassConfig {
            queue: self.queue,
            queue_timeout: timeout_ms(self.queue_timeout_ms),
            reserved: self.reserved,
        }
    }
}

/// A queue deadline in milliseconds, 0 for none.
fn timeout_ms(ms: u64) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms))
}

/// One priority class's part of an lg_gate_stats.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_class_stats {
    /// Requests of this class waiting in the queue.
    pub queued: u32,
    /// How many of this class may wait.
    pub queue_limit: u32,
    /// Requests of this class rejected because no slot was free for it and
    /// it could not queue.
    pub rejected_at_capacity: u64,
    /// Requests of this class rejected because they waited past its queue
    /// deadline.
    pub expired: u64,
    /// Requests of this class rejected because the gate was closed.
    pub rejected_closed: u64,
    /// Requests of this class that lost their place in the full queue to a
    /// more important arrival (LG_DISPLACED).
    pub displaced: u64,
}

impl From<ClassStats> for lg_gate_class_stats {
    fn from(c: ClassStats) -> Self {
        Self {
            queued: c.queued,
            queue_limit: c.queue_limit,
            rejected_at_capacity: c.rejected_at_capacity,
            expired: c.expired,
            rejected_closed: c.rejected_closed,
            displaced: c.displaced,
        }
    }
}

/// A snapshot of a gate's gauges and counters. The gauges (running,
/// queued, limit, closed, and with a wait limit or classes also waiting and
/// the classes' queued) are mutually consistent; the counters may be a
/// moment apart from them. The totals (rejected_at_capacity, expired,
/// rejected_closed, displaced) are the sums over the classes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_stats {
    /// Slots held (including slots granted to waiters not yet told).
    pub running: u32,
    /// Requests waiting in the queue.
    pub queued: u32,
    /// Engine slots N.
    pub limit: u32,
    /// Queue size Q.
    pub queue_limit: u32,
    /// Whether the gate is closed.
    pub closed: bool,
    /// Requests admitted without waiting.
    pub admitted_direct: u64,
    /// Requests admitted after waiting in the queue.
    pub admitted_queued: u64,
    /// Requests rejected because slots and queue were full.
    pub rejected_at_capacity: u64,
    /// Requests rejected because the gate was closed.
    pub rejected_closed: u64,
    /// Requests rejected because they waited past the queue deadline.
    pub expired: u64,
    /// Requests that left the queue before getting a slot (cancelled or
    /// timed out); not rejections.
    pub cancelled: u64,
    /// Admitted requests without their first response yet (always 0 without
    /// a wait limit).
    pub waiting: u32,
    /// Wait limit W, or 0 for none.
    pub wait_limit: u32,
    /// Requests rejected because they lost their place in the full queue to
    /// a more important arrival (LG_DISPLACED).
    pub displaced: u64,
    /// How many priority classes the gate has (1 without classes: the whole
    /// queue is class 0).
    pub class_count: usize,
    /// Each class's share, in its first class_count entries (the rest are
    /// zero).
    pub classes: [lg_gate_class_stats; LG_MAX_CLASSES],
}

impl lg_gate {
    fn build(config: GateConfig) -> Result<*mut lg_gate, Error> {
        let gate = AdmissionGate::new(config)?;
        Ok(Box::into_raw(Box::new(lg_gate {
            gate: Arc::new(gate),
        })))
    }
}

/// Fills `out` with the default settings for `limit` engine slots: queue 16,
/// no deadline, FIFO, prefix "dynamo", no wait limit, no priority classes.
/// The limit is checked by lg_gate_new().
///
/// Errors: LG_INVALID_ARGUMENT (NULL out).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out` is NULL or valid for writes of an lg_gate_config.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_config_default(limit: u32, out: *mut lg_gate_config) -> lg_status {
    guard(|| {
        let out = Out::new(out, "out")?;
        let config = lg_gate_config {
            limit,
            queue: DEFAULT_QUEUE_LIMIT,
            queue_timeout_ms: 0,
            adaptive_lifo: false,
            metrics_prefix: std::ptr::null(),
            metrics_prefix_len: 0,
            wait_limit: 0,
            classes: std::ptr::null(),
            class_count: 0,
        };
        // SAFETY: `out` is writable (contract).
        unsafe { out.write(config) };
        Ok(())
    })
}

/// Creates a gate.
///
/// Errors: LG_INVALID_ARGUMENT (NULL config or out_gate, limit 0 or above
/// 2097151, queue or wait_limit above 2097151, metrics prefix not matching
/// [a-zA-Z_:][a-zA-Z0-9_:]*, NULL classes with class_count > 0, class_count
/// above LG_MAX_CLASSES, a class's queue above the gate's queue or its
/// reserved above the limit; the message names the class and field).
/// Ownership: on LG_OK *out_gate owns a new gate; free it with
/// lg_gate_free(). The config and its classes are copied.
/// Thread safety: any thread. Blocking: never (allocates N + Q waiter
/// cells up front).
///
/// # Safety
/// `config` is NULL or points to a valid lg_gate_config whose metrics_prefix
/// is NULL or valid for metrics_prefix_len bytes and whose classes is NULL
/// or valid for class_count lg_gate_class; `out_gate` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_new(
    config: *const lg_gate_config,
    out_gate: *mut *mut lg_gate,
) -> lg_status {
    guard(|| {
        // SAFETY: `config` is NULL or valid (contract).
        let c = unsafe { input(config, "config") }?;
        let out = Out::new(out_gate, "out_gate")?;
        // SAFETY: NULL or valid for class_count classes (contract).
        let classes = unsafe { slice(c.classes, c.class_count, "classes") }?;
        let mut config = GateConfig::new(c.limit)
            .with_queue(c.queue)
            .with_queue_timeout(timeout_ms(c.queue_timeout_ms))
            .with_adaptive_lifo(c.adaptive_lifo)
            .with_wait_limit((c.wait_limit != 0).then_some(c.wait_limit));
        // Checked (count and values) by the gate's constructor.
        config.classes = classes.iter().map(lg_gate_class::core_class).collect();
        // SAFETY: NULL or valid for metrics_prefix_len bytes (contract).
        let prefix =
            unsafe { optional_string(c.metrics_prefix, c.metrics_prefix_len, "metrics_prefix") }?;
        if let Some(p) = prefix {
            config = config.with_metrics_prefix(p);
        }
        let handle = lg_gate::build(config)?;
        // SAFETY: `out_gate` is writable (contract).
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Creates a gate with `limit` engine slots (the --engine-request-limit
/// equivalent) and the queue size, deadline and wait limit read from
/// DYN_DYNAMO_REQUEST_QUEUE_LIMIT (default 16),
/// DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS (unset: off) and
/// DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT (unset: none). Call it only when
/// an engine limit is configured.
///
/// Errors: LG_INVALID_ARGUMENT (NULL out_gate, bad limit, a variable that is
/// set but empty or malformed; the message names it). Never a silent
/// fallback.
/// Ownership: as lg_gate_new().
/// Thread safety: any thread (reads the environment). Blocking: never.
///
/// # Safety
/// `out_gate` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_from_env(limit: u32, out_gate: *mut *mut lg_gate) -> lg_status {
    guard(|| {
        let out = Out::new(out_gate, "out_gate")?;
        let handle = lg_gate::build(GateConfig::from_env(limit)?)?;
        // SAFETY: `out_gate` is writable (contract).
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a gate handle. NULL is a no-op. This does not close the gate:
/// permits already handed out stay valid, and queued asynchronous requests
/// still get their callback (close the gate first to reject them).
///
/// Ownership: takes `gate`.
/// Thread safety: no other thread may be using this handle (for instance
/// blocked in lg_gate_admit()).
/// Blocking: never.
///
/// # Safety
/// `gate` is NULL or was returned by lg_gate_new()/lg_gate_from_env() and
/// not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_free(gate: *mut lg_gate) {
    boundary((), || {
        if !gate.is_null() {
            // SAFETY: a live handle given up by the caller (contract).
            drop(unsafe { Box::from_raw(gate) });
        }
    })
}
