//! `lg_scrape`: a monitor polling a stock vLLM or SGLang worker's
//! Prometheus /metrics (core's `loadgate::scrape`).

use std::ffi::c_char;
use std::time::Duration;

use loadgate_core::scrape::{Engine, Scrape, ScrapeConfig, ERROR_KINDS};

use crate::ffi::{boundary, guard, input, optional_string, string, Error, Out};
use crate::monitor::lg_monitor;
use crate::status::lg_status;

/// Which engine's metrics a scrape reads.
pub type lg_engine = u32;
/// vLLM (vllm:* metrics, data-parallel engines by the label engine).
pub const LG_ENGINE_VLLM: lg_engine = 0;
/// SGLang (sglang:* metrics, data-parallel ranks by the label dp_rank).
pub const LG_ENGINE_SGLANG: lg_engine = 1;

/// One worker's engine scrape. Opaque; create with lg_monitor_scrape(),
/// free (which stops it and removes the worker) with lg_scrape_free().
///
/// lg_scrape_get_stats() may be called from any number of threads at once.
pub struct lg_scrape {
    scrape: Scrape,
}

/// What a scrape has done so far.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_scrape_stats {
    /// Successful scrapes (applied to the monitor).
    pub scrapes: u64,
    /// Failed scrapes, every cause (the errors_* fields below).
    pub errors: u64,
    /// HTTP connections opened (1 while the first one lasts).
    pub connections: u64,
    /// Whether the worker is registered in the monitor now.
    pub registered: bool,
    /// Duration of the last scrape, in microseconds.
    pub last_latency_us: u64,
    /// Total duration of all scrapes, in microseconds.
    pub total_latency_us: u64,
    /// Connection refused, reset or closed.
    pub errors_connect: u64,
    /// No complete answer within the timeout.
    pub errors_timeout: u64,
    /// A status other than 200.
    pub errors_http: u64,
    /// A body over the limit (4 MiB).
    pub errors_too_large: u64,
    /// A metric the mapping reads was malformed or out of range.
    pub errors_malformed: u64,
    /// A metric the mapping needs was absent.
    pub errors_missing: u64,
    /// More ranks than a worker may declare.
    pub errors_too_many_ranks: u64,
    /// The monitor refused the registration or a report.
    pub errors_refused: u64,
}

fn engine(e: lg_engine) -> Result<Engine, Error> {
    match e {
        LG_ENGINE_VLLM => Ok(Engine::Vllm),
        LG_ENGINE_SGLANG => Ok(Engine::Sglang),
        other => Err(Error::invalid(format_args!(
            "engine {other} is not one of LG_ENGINE_VLLM (0), LG_ENGINE_SGLANG (1)"
        ))),
    }
}

/// Starts polling the engine at `url` ("http://host[:port][/path]"; the
/// path defaults to /metrics) every `interval_ms` milliseconds (0: 500) as
/// worker `worker_id` of `model` (NULL with length 0: the engine's
/// model_name label), reporting each data-parallel rank's KV cache usage,
/// capacity and waiting requests into `monitor`. A scrape taking longer
/// than `timeout_ms` (0: 2000) fails. `max_num_seqs` declares the requests
/// each rank runs at once at most (vLLM's --max-num-seqs, SGLang's
/// --max-running-requests), which neither engine's metrics carry; with an
/// SLO set (lg_monitor_set_slo()) a rank is never taken to hold more (0:
/// not known). The worker is registered on the first successful scrape;
/// failed scrapes are counted (lg_scrape_get_stats()) and leave its last
/// values in place.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor or out_scrape, bad string,
/// empty model, a url that is not http://host..., an unknown engine).
/// Ownership: on LG_OK *out_scrape owns a new scrape; free it with
/// lg_scrape_free(). It shares the monitor's state: freeing the monitor
/// first is allowed. The strings are copied.
/// Thread safety: any thread. Blocking: never; starts, on the first use in
/// the process, the library's I/O runtime thread, which runs the scrapes.
///
/// # Safety
/// `monitor` is NULL or a live monitor; `model` and `url` are NULL or
/// valid for their lengths; `out_scrape` is NULL or valid for writes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn lg_monitor_scrape(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    worker_id: u64,
    url: *const c_char,
    url_len: usize,
    engine_kind: lg_engine,
    interval_ms: u64,
    timeout_ms: u64,
    max_num_seqs: u64,
    out_scrape: *mut *mut lg_scrape,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: each string is NULL or valid for its length (contract).
        let model = unsafe { optional_string(model, model_len, "model") }?;
        // SAFETY: as above.
        let url = unsafe { string(url, url_len, "url") }?;
        let out = Out::new(out_scrape, "out_scrape")?;
        let mut config = ScrapeConfig::new(engine(engine_kind)?);
        if interval_ms > 0 {
            config.interval = Duration::from_millis(interval_ms);
        }
        if timeout_ms > 0 {
            config.timeout = Duration::from_millis(timeout_ms);
        }
        config.max_num_seqs = Some(max_num_seqs);
        let scrape = Scrape::start(m.monitor.clone(), model, worker_id, url, config)
            .map_err(Error::invalid)?;
        let handle = Box::into_raw(Box::new(lg_scrape { scrape }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Reads a scrape's counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL scrape or out_stats).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `scrape` is NULL or a live scrape; `out_stats` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_scrape_get_stats(
    scrape: *const lg_scrape,
    out_stats: *mut lg_scrape_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: `scrape` is NULL or live (contract).
        let s = unsafe { input(scrape, "scrape") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let st = s.scrape.stats();
        let by = |kind: &str| {
            ERROR_KINDS
                .iter()
                .position(|k| *k == kind)
                .map_or(0, |i| st.errors_by_kind[i])
        };
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let stats = lg_scrape_stats {
            scrapes: st.scrapes,
            errors: st.errors,
            connections: st.connections,
            registered: st.registered,
            last_latency_us: micros(st.last_latency),
            total_latency_us: micros(st.total_latency),
            errors_connect: by("connect"),
            errors_timeout: by("timeout"),
            errors_http: by("http"),
            errors_too_large: by("too_large"),
            errors_malformed: by("malformed"),
            errors_missing: by("missing"),
            errors_too_many_ranks: by("too_many_ranks"),
            errors_refused: by("refused"),
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Frees a scrape: stops it and removes the worker it registered from the
/// monitor; no report of it lands after the call returns. NULL is a no-op.
///
/// Ownership: takes `scrape`.
/// Thread safety: no other thread may be using the scrape.
/// Blocking: never.
///
/// # Safety
/// `scrape` is NULL or was returned by lg_monitor_scrape() and not freed
/// yet.
#[no_mangle]
pub unsafe extern "C" fn lg_scrape_free(scrape: *mut lg_scrape) {
    boundary((), || {
        if !scrape.is_null() {
            // SAFETY: a live handle from lg_monitor_scrape(), given up by the
            // caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(scrape) });
        }
    })
}
