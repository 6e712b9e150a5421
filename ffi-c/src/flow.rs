//! Frontend flow control from C (docs/flow-control.md): a model's queue
//! (lg_monitor_set_flow_control), dispatch through it, blocking with a
//! timeout (lg_monitor_dispatch) or with a callback
//! (lg_monitor_dispatch_async), and the dispatched request's handle
//! (`lg_dispatch`). Each is a thin call of core's `Monitor::dispatch_blocking`
//! and `Monitor::dispatch_with_callback`; the monitor's maintenance thread
//! sends what waits and keeps the deadlines.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use loadgate_core::flow::{FlowConfig, FlowRejection, FlowRequest, DEFAULT_OUTPUT_ESTIMATE};
use loadgate_core::monitor::{Dispatch, DispatchRequest, FlowControlConfig, FlowError};

use crate::ffi::{guard, input, optional, slice, string, Error, Out};
use crate::gate::LG_TIMEOUT_INFINITE;
use crate::monitor::{lg_monitor, lg_policy, policy, LG_POLICY_ROUND_ROBIN};
use crate::status::lg_status;

/// `max_tokens` of an lg_dispatch_request that gives none: the queue
/// reserves its configured output estimate.
pub const LG_NO_MAX_TOKENS: u64 = u64::MAX;

/// `blocks` of an lg_dispatch_request that gives none: its prompt in
/// blocks of 16 tokens (the default everywhere).
pub const LG_PROMPT_BLOCKS: u64 = u64::MAX;

/// One tenant's weight (see lg_flow_config.tenant_weights).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_tenant_weight {
    /// The tenant id, UTF-8, not NUL-terminated (at most 256 bytes).
    pub tenant: *const c_char,
    /// Its length in bytes.
    pub tenant_len: usize,
    /// Its weight, 0.000001 to 1000000.
    pub weight: f64,
}

/// A model's frontend queue (lg_monitor_set_flow_control()); start from
/// lg_flow_config_default().
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_flow_config {
    /// Most requests waiting, 1 to 1048576.
    pub queue_limit: u32,
    /// Most estimated tokens waiting (prompt plus reserved output); 0: no
    /// token bound.
    pub queue_tokens: u64,
    /// How long a request waits unless it gives its own, in milliseconds
    /// (default 60000; at most 3600000).
    pub deadline_ms: u64,
    /// VTC's w_p: what a prompt token costs its tenant (default 1).
    pub prompt_weight: f64,
    /// VTC's w_q: what an output token costs its tenant (default 2).
    pub output_weight: f64,
    /// Output tokens reserved for a request without max_tokens (default
    /// 256).
    pub output_estimate: u64,
    /// Most tenants remembered (default 4096).
    pub max_tenants: u32,
    /// Most requests that wait while the model has no workers, for one to
    /// join (at most queue_limit); 0 (the default) refuses them at once
    /// with LG_UNAVAILABLE.
    pub scale_up_limit: u32,
    /// How a free worker is picked: one of LG_POLICY_* (default
    /// round-robin).
    pub policy: lg_policy,
    /// Tenants' weights: tenant_weight_count entries, copied; NULL (with a
    /// count of 0) for none.
    pub tenant_weights: *const lg_tenant_weight,
    /// Number of entries in tenant_weights.
    pub tenant_weight_count: usize,
}

/// One request to dispatch; start from lg_dispatch_request_default().
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_dispatch_request {
    /// Its tenant id, UTF-8, not NUL-terminated; NULL (length 0) for the
    /// default tenant. At most 256 bytes.
    pub tenant: *const c_char,
    /// Its length in bytes.
    pub tenant_len: usize,
    /// Its priority band: 0 the most important (past 7 counts as 7).
    pub priority: u8,
    /// Prompt tokens (the uncached part, when known).
    pub prompt_tokens: u64,
    /// Most output tokens; LG_NO_MAX_TOKENS for the queue's estimate.
    pub max_tokens: u64,
    /// How long it may wait, in milliseconds; 0 for the queue's default.
    pub deadline_ms: u64,
    /// Whether it may wait when no worker is free; false refuses it at once
    /// (LG_OVERLOADED).
    pub queue: bool,
    /// KV blocks to book on the worker it is sent to; LG_PROMPT_BLOCKS
    /// (the default) for its prompt in blocks of 16 tokens.
    pub blocks: u64,
}

/// A request sent to a worker: its worker, its booking and what its tenant
/// owes until it completes. Complete it with lg_dispatch_complete() exactly
/// once (that frees it).
pub struct lg_dispatch {
    dispatch: Dispatch,
}

impl lg_dispatch {
    fn into_raw(dispatch: Dispatch) -> *mut lg_dispatch {
        Box::into_raw(Box::new(lg_dispatch { dispatch }))
    }
}

/// A dispatch's outcome for a callback: LG_OK with a dispatch the callee
/// owns (complete it with lg_dispatch_complete()), or the refusal with a
/// NULL dispatch.
pub type lg_dispatch_callback = Option<
    unsafe extern "C" fn(user_data: *mut c_void, status: lg_status, dispatch: *mut lg_dispatch),
>;

/// The status of a refused dispatch.
pub(crate) fn flow_status(e: FlowRejection) -> lg_status {
    match e {
        FlowRejection::QueueFull => lg_status::LG_QUEUE_FULL,
        FlowRejection::QueueDeadline => lg_status::LG_QUEUE_DEADLINE,
        FlowRejection::NoWorkers => lg_status::LG_UNAVAILABLE,
        FlowRejection::AllWorkersBusy => lg_status::LG_OVERLOADED,
        FlowRejection::InvalidTenant => lg_status::LG_INVALID_ARGUMENT,
        FlowRejection::TimedOut => lg_status::LG_TIMED_OUT,
    }
}

fn flow_error(e: FlowRejection) -> Error {
    Error::new(flow_status(e), e)
}

impl From<FlowError> for Error {
    fn from(e: FlowError) -> Self {
        match e {
            FlowError::Model(t) => t.into(),
            FlowError::Config(c) => Error::invalid(c),
        }
    }
}

/// Fills `out` with the default queue of `queue_limit` requests: no token
/// bound, 60 s deadline, weights 1 and 2, an output estimate of 256 tokens,
/// 4096 tenants, round-robin, no tenant weights. The limit is checked by
/// lg_monitor_set_flow_control().
///
/// Errors: LG_INVALID_ARGUMENT (NULL out).
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_flow_config_default(
    queue_limit: u32,
    out: *mut lg_flow_config,
) -> lg_status {
    guard(|| {
        let out = Out::new(out, "out")?;
        let d = FlowConfig::new(queue_limit);
        let config = lg_flow_config {
            queue_limit,
            queue_tokens: 0,
            deadline_ms: d.deadline.as_millis() as u64,
            prompt_weight: d.prompt_weight,
            output_weight: d.output_weight,
            output_estimate: DEFAULT_OUTPUT_ESTIMATE,
            max_tenants: d.max_tenants as u32,
            scale_up_limit: 0,
            policy: LG_POLICY_ROUND_ROBIN,
            tenant_weights: std::ptr::null(),
            tenant_weight_count: 0,
        };
        // SAFETY: writable (contract).
        unsafe { out.write(config) };
        Ok(())
    })
}

/// Turns `model`'s frontend queue on with `config`, or off with a NULL
/// config (requests waiting then get LG_QUEUE_FULL). A new config starts a
/// new queue; the requests waiting in the old one get LG_QUEUE_FULL.
///
/// Errors: LG_NOT_FOUND (unknown model), LG_INVALID_ARGUMENT (NULL monitor,
/// bad model string, a setting out of range: the message names it).
/// Ownership: the config and its tenant weights are copied.
/// Thread safety: any thread. Blocking: never (takes the queue's lock).
///
/// # Safety
/// `monitor` is NULL or live; `model` is NULL or valid for `model_len`
/// bytes; `config` is NULL or a valid lg_flow_config whose tenant_weights is
/// NULL or valid for tenant_weight_count entries, each tenant valid for its
/// length.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_set_flow_control(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    config: *const lg_flow_config,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: valid for model_len bytes (contract).
        let model = unsafe { string(model, model_len, "model") }?;
        // SAFETY: NULL or valid (contract).
        let Some(c) = (unsafe { optional(config, "config") })? else {
            return Ok(m.monitor.set_flow_control(model, None)?);
        };
        // SAFETY: its tenant weights are valid (contract).
        let config = unsafe { config_of(c) }?;
        Ok(m.monitor.set_flow_control(model, Some(&config))?)
    })
}

/// The core config an lg_flow_config asks for.
///
/// # Safety
/// `c.tenant_weights` is NULL or valid for `c.tenant_weight_count`
/// entries, each tenant valid for its length.
unsafe fn config_of(c: &lg_flow_config) -> Result<FlowControlConfig, Error> {
    let mut queue = FlowConfig::new(c.queue_limit);
    queue.queue_tokens = (c.queue_tokens != 0).then_some(c.queue_tokens);
    queue.deadline = Duration::from_millis(c.deadline_ms);
    queue.prompt_weight = c.prompt_weight;
    queue.output_weight = c.output_weight;
    queue.output_estimate = c.output_estimate;
    queue.max_tenants = c.max_tenants as usize;
    queue.scale_up_limit = c.scale_up_limit;
    // SAFETY: valid for tenant_weight_count entries (contract).
    let weights = unsafe { slice(c.tenant_weights, c.tenant_weight_count, "tenant_weights") }?;
    for w in weights {
        // SAFETY: each tenant is valid for its length (contract).
        let name = unsafe { string(w.tenant, w.tenant_len, "tenant_weights[].tenant") }?;
        queue.tenant_weights.push((name.to_owned(), w.weight));
    }
    Ok(FlowControlConfig {
        queue,
        policy: policy(c.policy)?,
    })
}

/// Sets the flow control every model created from now on starts with
/// (NULL: none); models that exist keep theirs (lg_monitor_set_flow_control()
/// changes one).
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, a setting out of range: the
/// message names it). A refused config changes nothing.
/// Ownership: the config and its tenant weights are copied.
/// Thread safety: any thread. Blocking: never (takes the defaults' lock).
///
/// # Safety
/// `monitor` is NULL or live; `config` is NULL or a valid lg_flow_config
/// whose tenant_weights is NULL or valid for tenant_weight_count entries,
/// each tenant valid for its length.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_set_default_flow_control(
    monitor: *const lg_monitor,
    config: *const lg_flow_config,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: NULL or valid (contract).
        let config = match unsafe { optional(config, "config") }? {
            // SAFETY: its tenant weights are valid (contract).
            Some(c) => Some(unsafe { config_of(c) }?),
            None => None,
        };
        Ok(m.monitor.set_default_flow_control(config.as_ref())?)
    })
}

/// Fills `out` with a request of the default tenant, priority 0, no
/// tokens, the queue's estimate and deadline, allowed to wait, booking its
/// prompt's blocks (LG_PROMPT_BLOCKS).
///
/// Errors: LG_INVALID_ARGUMENT (NULL out).
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_request_default(out: *mut lg_dispatch_request) -> lg_status {
    guard(|| {
        let out = Out::new(out, "out")?;
        let r = lg_dispatch_request {
            tenant: std::ptr::null(),
            tenant_len: 0,
            priority: 0,
            prompt_tokens: 0,
            max_tokens: LG_NO_MAX_TOKENS,
            deadline_ms: 0,
            queue: true,
            blocks: LG_PROMPT_BLOCKS,
        };
        // SAFETY: writable (contract).
        unsafe { out.write(r) };
        Ok(())
    })
}

/// The monitor, model and request of a dispatch call.
///
/// # Safety
/// As lg_monitor_dispatch().
unsafe fn inputs<'a>(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    request: *const lg_dispatch_request,
) -> Result<(&'a lg_monitor, &'a str, DispatchRequest<'a>), Error> {
    // SAFETY: NULL or live (contract).
    let m = unsafe { input(monitor, "monitor") }?;
    // SAFETY: valid for model_len bytes (contract).
    let model = unsafe { string(model, model_len, "model") }?;
    // SAFETY: NULL or valid (contract).
    let r = unsafe { input(request, "request") }?;
    let tenant = if r.tenant.is_null() && r.tenant_len == 0 {
        ""
    } else {
        // SAFETY: valid for tenant_len bytes (contract).
        unsafe { string(r.tenant, r.tenant_len, "tenant") }?
    };
    let request = DispatchRequest {
        flow: FlowRequest {
            tenant,
            priority: r.priority,
            prompt_tokens: r.prompt_tokens,
            max_tokens: (r.max_tokens != LG_NO_MAX_TOKENS).then_some(r.max_tokens),
            deadline: (r.deadline_ms != 0).then(|| Duration::from_millis(r.deadline_ms)),
        },
        blocks: (r.blocks != LG_PROMPT_BLOCKS).then_some(r.blocks),
        queue: r.queue,
    };
    Ok((m, model, request))
}

/// Sends a request of `model` to a free worker, or waits in the model's
/// queue for one, blocking the calling thread until it is sent, refused, or
/// `timeout_ms` passes (LG_TIMEOUT_INFINITE: no limit of its own). Without
/// flow control on the model, a request that finds no free worker is
/// refused at once (LG_OVERLOADED).
///
/// Errors: LG_QUEUE_FULL (the queue was full and this request was the one
/// turned away), LG_QUEUE_DEADLINE (it waited until its deadline),
/// LG_OVERLOADED (no free worker and it may not wait), LG_UNAVAILABLE (no
/// worker serves the model), LG_TIMED_OUT (timeout_ms ran out first; the
/// request left the queue), LG_INVALID_ARGUMENT (NULL monitor, request or
/// out_dispatch, bad model or tenant string, a tenant over 256 bytes).
/// Ownership: on LG_OK *out_dispatch owns the dispatch; complete it with
/// lg_dispatch_complete() exactly once.
/// Thread safety: any thread. Blocking: yes, up to timeout_ms and the
/// request's deadline.
///
/// # Safety
/// `monitor` is NULL or live; `model` is NULL or valid for `model_len`
/// bytes; `request` is NULL or valid, its tenant valid for its length;
/// `out_dispatch` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_dispatch(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    request: *const lg_dispatch_request,
    timeout_ms: u64,
    out_dispatch: *mut *mut lg_dispatch,
) -> lg_status {
    guard(|| {
        let out = Out::new(out_dispatch, "out_dispatch")?;
        // SAFETY: forwarded contract.
        let (m, model, request) = unsafe { inputs(monitor, model, model_len, request) }?;
        let timeout =
            (timeout_ms != LG_TIMEOUT_INFINITE).then(|| Duration::from_millis(timeout_ms));
        let dispatch = m
            .monitor
            .dispatch_blocking(model, &request, timeout)
            .map_err(flow_error)?;
        // SAFETY: writable (contract).
        unsafe { out.write(lg_dispatch::into_raw(dispatch)) };
        Ok(())
    })
}

/// The C callback and its user data.
struct Target {
    callback: unsafe extern "C" fn(*mut c_void, lg_status, *mut lg_dispatch),
    user_data: *mut c_void,
}

// SAFETY: the caller of lg_monitor_dispatch_async() promises that the
// callback may be called with `user_data` from any thread.
unsafe impl Send for Target {}

impl Target {
    fn call(self, outcome: Result<Dispatch, FlowRejection>) {
        let (status, dispatch) = match outcome {
            Ok(d) => (lg_status::LG_OK, lg_dispatch::into_raw(d)),
            Err(e) => (flow_status(e), std::ptr::null_mut()),
        };
        // SAFETY: callable once with `user_data` from any thread (contract
        // of lg_monitor_dispatch_async()).
        unsafe { (self.callback)(self.user_data, status, dispatch) };
    }
}

/// lg_monitor_dispatch() without blocking: the outcome goes to
/// `callback(user_data, status, dispatch)` exactly once, LG_OK with a
/// dispatch the callee owns (complete it with lg_dispatch_complete()), or
/// LG_QUEUE_FULL, LG_QUEUE_DEADLINE, LG_OVERLOADED, LG_UNAVAILABLE or
/// LG_INVALID_ARGUMENT (a bad tenant) with a NULL dispatch. It runs on this
/// thread, before this returns, when the request is sent or refused at
/// once; otherwise on the monitor's maintenance thread, which sends
/// waiting requests when a report, a completed dispatch, a worker added,
/// new thresholds or an ended lease frees a worker, and refuses them at
/// their deadlines. It never runs on the thread of a report or of another
/// request's call, and callbacks never nest.
///
/// The callback must be quick, must not throw or unwind, and must not
/// block on the monitor; it may complete its dispatch at once or dispatch
/// again.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, request or callback, bad model
/// or tenant string); then the callback is never called.
/// Ownership: `user_data` must stay valid until the callback has run.
/// Thread safety: any thread; `user_data` must be usable from the thread
/// the callback runs on. Blocking: never (allocates the task).
///
/// # Safety
/// As lg_monitor_dispatch(); `callback` is NULL or a function that is safe
/// to call once with `user_data` from any thread.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_dispatch_async(
    monitor: *const lg_monitor,
    model: *const c_char,
    model_len: usize,
    request: *const lg_dispatch_request,
    callback: lg_dispatch_callback,
    user_data: *mut c_void,
) -> lg_status {
    guard(|| {
        let callback = callback.ok_or_else(|| Error::invalid("callback must not be NULL"))?;
        // SAFETY: forwarded contract.
        let (m, model, request) = unsafe { inputs(monitor, model, model_len, request) }?;
        let target = Target {
            callback,
            user_data,
        };
        // The handle is dropped: the callback is called exactly once.
        drop(m.monitor.dispatch_with_callback(
            model,
            &request,
            Box::new(move |outcome| target.call(outcome)),
        ));
        Ok(())
    })
}

/// Takes `dispatch` back from the host, whatever the outcome: NULL, or
/// live and not completed (contract).
///
/// # Safety
/// As lg_monitor_redispatch().
unsafe fn take_dispatch(dispatch: *mut lg_dispatch) -> Result<Dispatch, Error> {
    if dispatch.is_null() {
        return Err(Error::invalid("dispatch must not be NULL"));
    }
    // SAFETY: live and ours to take (contract).
    Ok(unsafe { Box::from_raw(dispatch) }.dispatch)
}

/// Hands back a dispatch whose worker refused the request before it
/// started (the worker answered 529 "at capacity", or the request reached
/// its deadline in the worker's queue), blocking like
/// lg_monitor_dispatch(). The refusing worker is put under its overload
/// lease and the booking released. With flow control on the model the
/// request goes back into its queue at its original place, with what is
/// left of its deadline, and its tenant is charged once in all; without,
/// it is routed once more to another free worker, at most
/// lg_monitor_config.reroutes times (default 1), and otherwise refused with
/// LG_OVERLOADED.
///
/// Errors: as lg_monitor_dispatch(); LG_UNAVAILABLE for a dispatch of
/// another monitor or of a model removed since; LG_INVALID_ARGUMENT for a
/// NULL monitor, dispatch or out_dispatch.
/// Ownership: takes `dispatch` in every case (a NULL monitor or
/// out_dispatch completes it); on LG_OK *out_dispatch owns the new
/// dispatch.
/// Thread safety: any thread. Blocking: yes, up to timeout_ms and the
/// request's deadline.
///
/// # Safety
/// `monitor` is NULL or live; `dispatch` is NULL or a live dispatch not
/// completed; `out_dispatch` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_redispatch(
    monitor: *const lg_monitor,
    dispatch: *mut lg_dispatch,
    timeout_ms: u64,
    out_dispatch: *mut *mut lg_dispatch,
) -> lg_status {
    guard(|| {
        // SAFETY: forwarded contract.
        let dispatch = unsafe { take_dispatch(dispatch) }?;
        let out = Out::new(out_dispatch, "out_dispatch")?;
        // SAFETY: NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        let timeout =
            (timeout_ms != LG_TIMEOUT_INFINITE).then(|| Duration::from_millis(timeout_ms));
        let again = m
            .monitor
            .redispatch(dispatch)
            .wait(timeout)
            .map_err(flow_error)?;
        // SAFETY: writable (contract).
        unsafe { out.write(lg_dispatch::into_raw(again)) };
        Ok(())
    })
}

/// lg_monitor_redispatch() without blocking: the outcome goes to
/// `callback(user_data, status, dispatch)` exactly once, as for
/// lg_monitor_dispatch_async().
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, dispatch or callback); then
/// the callback is never called.
/// Ownership: takes `dispatch` in every case (a NULL monitor or callback
/// completes it); `user_data` must stay valid until the callback has run.
/// Thread safety: as lg_monitor_dispatch_async(). Blocking: never.
///
/// # Safety
/// As lg_monitor_redispatch(); `callback` as for
/// lg_monitor_dispatch_async().
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_redispatch_async(
    monitor: *const lg_monitor,
    dispatch: *mut lg_dispatch,
    callback: lg_dispatch_callback,
    user_data: *mut c_void,
) -> lg_status {
    guard(|| {
        // SAFETY: forwarded contract.
        let dispatch = unsafe { take_dispatch(dispatch) }?;
        let callback = callback.ok_or_else(|| Error::invalid("callback must not be NULL"))?;
        // SAFETY: NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        let target = Target {
            callback,
            user_data,
        };
        // The handle is dropped: the callback is called exactly once.
        drop(
            m.monitor
                .redispatch_with_callback(dispatch, Box::new(move |outcome| target.call(outcome))),
        );
        Ok(())
    })
}

/// The worker the request was sent to (0 for a NULL dispatch).
///
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `dispatch` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_worker(dispatch: *const lg_dispatch) -> u64 {
    crate::ffi::boundary(0, || {
        // SAFETY: NULL or live (contract).
        unsafe { dispatch.as_ref() }.map_or(0, |d| d.dispatch.worker_id())
    })
}

/// The data-parallel rank the request's blocks are booked on (0 for a NULL
/// dispatch).
///
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `dispatch` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_dp_rank(dispatch: *const lg_dispatch) -> u32 {
    crate::ffi::boundary(0, || {
        // SAFETY: NULL or live (contract).
        unsafe { dispatch.as_ref() }.map_or(0, |d| d.dispatch.dp_rank())
    })
}

/// `blocks` more KV blocks of the request's generated output, booked on
/// its worker.
///
/// Errors: LG_INVALID_ARGUMENT (NULL dispatch).
/// Thread safety: one thread at a time per dispatch. Blocking: never
/// (lock-free).
///
/// # Safety
/// As lg_dispatch_report_output().
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_add_output_blocks(
    dispatch: *mut lg_dispatch,
    blocks: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, ours alone (contract).
        let d = unsafe { dispatch.as_mut() }
            .ok_or_else(|| Error::invalid("dispatch must not be NULL"))?;
        d.dispatch.add_output_blocks(blocks);
        Ok(())
    })
}

/// `tokens` more output tokens of the request: charged to its tenant at
/// once.
///
/// Errors: LG_INVALID_ARGUMENT (NULL dispatch).
/// Thread safety: one thread at a time per dispatch. Blocking: never (takes
/// the queue's lock).
///
/// # Safety
/// `dispatch` is NULL or live, and not used by another thread meanwhile.
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_report_output(
    dispatch: *mut lg_dispatch,
    tokens: u64,
) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, ours alone (contract).
        let d = unsafe { dispatch.as_mut() }
            .ok_or_else(|| Error::invalid("dispatch must not be NULL"))?;
        d.dispatch.report_output(tokens);
        Ok(())
    })
}

/// The request's first token came: its prompt stops counting as prefill on
/// the worker.
///
/// Errors: LG_INVALID_ARGUMENT (NULL dispatch).
/// Thread safety: one thread at a time per dispatch. Blocking: never.
///
/// # Safety
/// As lg_dispatch_report_output().
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_prefill_done(dispatch: *mut lg_dispatch) -> lg_status {
    guard(|| {
        // SAFETY: NULL or live, ours alone (contract).
        let d = unsafe { dispatch.as_mut() }
            .ok_or_else(|| Error::invalid("dispatch must not be NULL"))?;
        d.dispatch.prefill_done();
        Ok(())
    })
}

/// The request finished with `output_tokens` in all: its tenant is charged
/// what was not reported, its booking released, and the dispatch freed.
/// NULL is a no-op.
///
/// Thread safety: any thread. Blocking: never (takes the queue's lock).
///
/// # Safety
/// `dispatch` is NULL or a live dispatch, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn lg_dispatch_complete(dispatch: *mut lg_dispatch, output_tokens: u64) {
    crate::ffi::boundary((), || {
        if !dispatch.is_null() {
            // SAFETY: live and ours to free (contract).
            let d = unsafe { Box::from_raw(dispatch) };
            d.dispatch.complete(output_tokens);
        }
    })
}
