//! `lg_monitor`'s metrics: the frontend metrics in Prometheus text format
//! (lg_monitor_metrics()). The monitor's read-out for scrapers, kept apart
//! from the calls that change or consult its load table.

use std::ffi::c_char;

use crate::ffi::{guard, input, TextBuf};
use crate::status::lg_status;

use super::lg_monitor;

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
