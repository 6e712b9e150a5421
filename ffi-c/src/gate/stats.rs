//! `lg_gate`'s read-outs: the stats snapshot (lg_gate_get_stats()) and the
//! Prometheus metrics text (lg_gate_metrics()). Kept together, and apart
//! from the calls that admit to or change the gate, because both only read
//! its gauges and counters.

use std::ffi::c_char;

use crate::ffi::{guard, input, Out, TextBuf};
use crate::status::lg_status;

use super::{lg_gate, lg_gate_class_stats, lg_gate_stats};

/// A snapshot of the gate's gauges and counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_stats).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_stats` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_get_stats(
    gate: *const lg_gate,
    out_stats: *mut lg_gate_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let s = g.gate.stats();
        let stats = lg_gate_stats {
            running: s.running,
            queued: s.queued,
            limit: s.limit,
            queue_limit: s.queue_limit,
            closed: s.closed,
            admitted_direct: s.admitted_direct,
            admitted_queued: s.admitted_queued,
            rejected_at_capacity: s.rejected_at_capacity,
            rejected_closed: s.rejected_closed,
            expired: s.expired,
            cancelled: s.cancelled,
            waiting: s.waiting,
            wait_limit: s.wait_limit.unwrap_or(0),
            displaced: s.displaced,
            class_count: s.class_count,
            // Core zeroes the entries past class_count.
            classes: s.classes.map(lg_gate_class_stats::from),
        };
        // SAFETY: `out_stats` is writable (contract).
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Writes the worker metrics (Prometheus text format:
/// dynamo_rejection_request_total, dynamo_engine_request,
/// dynamo_request_queue, ..., the queue-wait histogram and the
/// dynamo_backend_admission_* family) into `buf` with
/// snprintf semantics, as lg_monitor_metrics() does.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_needed, NULL buf with
/// buf_len > 0), LG_BUFFER_TOO_SMALL.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free); allocates
/// (cold path).
///
/// # Safety
/// `gate` is NULL or a live gate; `buf` is NULL or valid for writes of
/// `buf_len` bytes; `out_needed` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_metrics(
    gate: *const lg_gate,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let text = TextBuf::new(buf, buf_len, out_needed)?;
        let metrics = g.gate.metrics_text();
        // SAFETY: `buf` and `out_needed` are writable (contract).
        unsafe { text.write(metrics.as_bytes()) }
    })
}
