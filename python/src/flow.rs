//! Frontend flow control for Python (docs/flow-control.md): the
//! `Monitor`'s `set_flow_control` and `dispatch` (an awaitable over core's
//! `Monitor::dispatch_with_callback`), and the ticket of a dispatched
//! request.
//!
//! `dispatch` makes an asyncio future on the running loop, then asks core.
//! An outcome decided at once (sent, or refused) is kept and returned by
//! the first await without a trip through the loop. Otherwise core calls
//! the callback later on the monitor's maintenance thread (which sends
//! what waits and keeps the deadlines), and the callback settles the
//! future on its loop (`loop.call_soon_threadsafe`). Only that thread
//! takes the GIL for a waiting request: reports and bookings never do.
//! Cancelling the awaiting task takes the request out of the queue, or,
//! if it was sent meanwhile, completes its dispatch (`loadgate._flow`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchHandle, DispatchRequest, FlowControlConfig};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyMapping};

use crate::errors::select_args;
use crate::errors::{
    f64_arg, opt_str_arg, opt_u64_arg, priority_arg, rejection_class, seconds_arg, str_ref,
    threshold_error, u32_arg, u64_arg,
};
use crate::monitor::Monitor;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[pymethods]
impl Monitor {
    /// Turns `model`'s frontend queue on (`queue_limit` requests, 1 to
    /// 1048576), or off with `queue_limit=0` (what waits is refused with
    /// `queue_full`). `queue_tokens` bounds the estimated tokens waiting;
    /// `deadline` is how long a request waits unless it gives its own
    /// (seconds, default 60); `prompt_weight` and `output_weight` are VTC's
    /// `w_p` and `w_q`; `tenant_weights` maps tenant ids to weights;
    /// `output_estimate` is the output reserved for a request without
    /// `max_tokens`; `scale_up_limit` is how many requests may wait while
    /// the model has no workers, for one to join (0: refused at once);
    /// `policy` picks a free worker. Raises `KeyError` for an unknown model
    /// and `ValueError` naming a bad setting.
    #[pyo3(
        signature = (model, *, queue_limit, queue_tokens = None, deadline = None, prompt_weight = None, output_weight = None, tenant_weights = None, output_estimate = None, max_tenants = None, scale_up_limit = None, policy = None),
        text_signature = "(self, model, *, queue_limit, queue_tokens=None, deadline=60.0, prompt_weight=1.0, output_weight=2.0, tenant_weights=None, output_estimate=256, max_tenants=4096, scale_up_limit=0, policy='round_robin')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn set_flow_control(
        &self,
        model: &Bound<'_, PyAny>,
        queue_limit: &Bound<'_, PyAny>,
        queue_tokens: Option<&Bound<'_, PyAny>>,
        deadline: Option<&Bound<'_, PyAny>>,
        prompt_weight: Option<&Bound<'_, PyAny>>,
        output_weight: Option<&Bound<'_, PyAny>>,
        tenant_weights: Option<&Bound<'_, PyAny>>,
        output_estimate: Option<&Bound<'_, PyAny>>,
        max_tenants: Option<&Bound<'_, PyAny>>,
        scale_up_limit: Option<&Bound<'_, PyAny>>,
        policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let model = str_ref(model, "model")?;
        let config = flow_config(FlowArgs {
            queue_limit,
            queue_tokens,
            deadline,
            prompt_weight,
            output_weight,
            tenant_weights,
            output_estimate,
            max_tenants,
            scale_up_limit,
            policy,
        })?;
        self.inner
            .set_flow_control(model, config.as_ref())
            .map_err(flow_error)
    }

    /// Sets the flow control every model created from now on starts with
    /// (the same settings as `set_flow_control`; `queue_limit=0`: none).
    /// Models that exist keep theirs.
    #[pyo3(
        signature = (*, queue_limit, queue_tokens = None, deadline = None, prompt_weight = None, output_weight = None, tenant_weights = None, output_estimate = None, max_tenants = None, scale_up_limit = None, policy = None),
        text_signature = "(self, *, queue_limit, queue_tokens=None, deadline=60.0, prompt_weight=1.0, output_weight=2.0, tenant_weights=None, output_estimate=256, max_tenants=4096, scale_up_limit=0, policy='round_robin')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn set_default_flow_control(
        &self,
        queue_limit: &Bound<'_, PyAny>,
        queue_tokens: Option<&Bound<'_, PyAny>>,
        deadline: Option<&Bound<'_, PyAny>>,
        prompt_weight: Option<&Bound<'_, PyAny>>,
        output_weight: Option<&Bound<'_, PyAny>>,
        tenant_weights: Option<&Bound<'_, PyAny>>,
        output_estimate: Option<&Bound<'_, PyAny>>,
        max_tenants: Option<&Bound<'_, PyAny>>,
        scale_up_limit: Option<&Bound<'_, PyAny>>,
        policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let config = flow_config(FlowArgs {
            queue_limit,
            queue_tokens,
            deadline,
            prompt_weight,
            output_weight,
            tenant_weights,
            output_estimate,
            max_tenants,
            scale_up_limit,
            policy,
        })?;
        self.inner
            .set_default_flow_control(config.as_ref())
            .map_err(flow_error)
    }

    /// Sends a request of `model` to a free worker, or waits in the model's
    /// queue for one: `ticket = await monitor.dispatch(model, tenant=...,
    /// prompt_tokens=..., max_tokens=...)`, called on a running event loop.
    /// `tenant` (default: the default tenant), `priority` (0 the most
    /// important), `deadline` (seconds, default the queue's), `queue=False`
    /// to be refused at once instead of waiting, and `blocks`, the KV
    /// blocks to book on the worker (default: the prompt in blocks of 16).
    /// Raises `Overloaded` (reason `queue_full`, or `all_workers_busy` when
    /// not queueing), `QueueTimeout` (reason `queue_deadline`) or
    /// `Unavailable` (`no_workers`), each with `retry_after` from the
    /// queue's drain rate.
    #[pyo3(
        signature = (model, *, tenant = None, priority = None, prompt_tokens = None, max_tokens = None, deadline = None, queue = true, blocks = None),
        text_signature = "(self, model, *, tenant=None, priority=0, prompt_tokens=0, max_tokens=None, deadline=None, queue=True, blocks=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        tenant: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        prompt_tokens: Option<&Bound<'_, PyAny>>,
        max_tokens: Option<&Bound<'_, PyAny>>,
        deadline: Option<&Bound<'_, PyAny>>,
        queue: bool,
        blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<FlowDispatch> {
        let model = str_ref(model, "model")?;
        let tenant = opt_str_arg(tenant, "tenant")?;
        let deadline = match deadline.filter(|d| !d.is_none()) {
            Some(d) => Some(seconds_arg(d, "deadline")?),
            None => None,
        };
        let request = DispatchRequest {
            flow: FlowRequest {
                tenant: tenant.as_deref().unwrap_or(""),
                priority: priority_arg(priority)?,
                prompt_tokens: opt_u64_arg(prompt_tokens, "prompt_tokens")?.unwrap_or(0),
                max_tokens: opt_u64_arg(max_tokens, "max_tokens")?,
                deadline,
            },
            blocks: opt_u64_arg(blocks, "blocks")?,
            queue,
        };
        awaitable(py, &self.inner, model, |callback| {
            self.inner.dispatch_with_callback(model, &request, callback)
        })
    }

    /// Hands back a ticket whose worker refused the request before it
    /// started (it answered 529, or the request reached its deadline in
    /// the worker's queue): `ticket = await monitor.redispatch(ticket)`.
    /// The refusing worker is put under its overload lease and the booking
    /// released. With flow control the request goes back into its model's
    /// queue at its original place, with what is left of its deadline (its
    /// tenant is charged once in all); without, it is sent to another free
    /// worker at most `reroutes` times (the monitor's setting, default 1),
    /// else refused. Raises as `dispatch` does, and `ValueError` for a
    /// ticket completed or handed back already.
    fn redispatch(&self, py: Python<'_>, ticket: &Bound<'_, PyAny>) -> PyResult<FlowDispatch> {
        let native = match ticket.getattr(intern!(py, "_native")) {
            Ok(n) => n,
            Err(_) => ticket.clone(),
        };
        let native = native
            .cast::<FlowTicket>()
            .map_err(|_| PyValueError::new_err("redispatch takes a ticket from dispatch"))?;
        let dispatch = lock(&native.get().dispatch).take().ok_or_else(|| {
            PyValueError::new_err("the ticket was completed or handed back already")
        })?;
        let model = dispatch.model().to_owned();
        awaitable(py, &self.inner, &model, |callback| {
            self.inner.redispatch_with_callback(dispatch, callback)
        })
    }
}

/// The awaitable of a dispatch that `start` begins with the callback it is
/// given: made on the running event loop, its outcome kept if decided at
/// once.
fn awaitable(
    py: Python<'_>,
    monitor: &Arc<loadgate::Monitor>,
    model: &str,
    start: impl FnOnce(loadgate::monitor::DispatchCallback) -> DispatchHandle,
) -> PyResult<FlowDispatch> {
    static GET_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let event_loop = GET_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
        .map_err(|_| PyRuntimeError::new_err("dispatch needs a running event loop"))?;
    let fut = event_loop.call_method0(intern!(py, "create_future"))?;
    let slot = Arc::new(Mutex::new(Slot::Arming(None)));
    let callback = {
        let slot = Arc::clone(&slot);
        let monitor = Arc::downgrade(monitor);
        let model = model.to_owned();
        Box::new(move |outcome| deliver(&slot, &monitor, &model, outcome))
    };
    let handle = start(callback);
    let armed = Slot::Armed(fut.clone().unbind());
    let early = match std::mem::replace(&mut *lock(&slot), armed) {
        Slot::Arming(early) => early,
        Slot::Armed(_) => None,
    };
    Ok(FlowDispatch {
        state: Mutex::new(match early {
            Some(outcome) => Await::Ready(outcome),
            None => Await::Waiting(fut.unbind(), handle),
        }),
    })
}

/// Where a dispatch's outcome goes: kept while `dispatch` is still arming
/// (an outcome decided at once, or by the maintenance thread before the
/// arm), then to the asyncio future.
enum Slot {
    Arming(Option<Outcome>),
    Armed(Py<PyAny>),
}

/// A dispatch's outcome as Python sees it: a ticket, or the exception.
type Outcome = Result<Py<FlowTicket>, PyErr>;

/// The callback: builds the outcome's Python value (with the GIL, on the
/// thread core calls it on) and settles the future on its loop.
fn deliver(
    slot: &Mutex<Slot>,
    monitor: &Weak<loadgate::Monitor>,
    model: &str,
    outcome: Result<Dispatch, FlowRejection>,
) {
    Python::attach(|py| {
        let value: Outcome = match outcome {
            Ok(d) => Py::new(py, FlowTicket::new(d)),
            Err(e) => {
                let retry = monitor.upgrade().and_then(|m| m.flow_retry_after(model));
                Err(rejection(py, e, retry))
            }
        };
        let fut = {
            let mut slot = lock(slot);
            match &mut *slot {
                Slot::Arming(early) => {
                    *early = Some(value);
                    return;
                }
                Slot::Armed(fut) => fut.clone_ref(py),
            }
        };
        static SETTLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let fut = fut.bind(py);
        let (ok, value) = match value {
            Ok(ticket) => (true, ticket.into_any()),
            Err(e) => (false, e.into_value(py).into_any()),
        };
        let settled = SETTLE
            .import(py, "loadgate._flow", "_settle")
            .and_then(|settle| {
                let event_loop = fut.call_method0(intern!(py, "get_loop"))?;
                event_loop.call_method1(
                    intern!(py, "call_soon_threadsafe"),
                    (settle, fut, ok, &value),
                )
            });
        if settled.is_err() && ok {
            // A closed loop: its task is gone. A ticket nobody will take
            // is completed now.
            if let Ok(ticket) = value.bind(py).cast::<FlowTicket>() {
                ticket.get().complete_now();
            }
        }
    });
}

/// `set_flow_control`'s keyword arguments.
struct FlowArgs<'a, 'py> {
    queue_limit: &'a Bound<'py, PyAny>,
    queue_tokens: Option<&'a Bound<'py, PyAny>>,
    deadline: Option<&'a Bound<'py, PyAny>>,
    prompt_weight: Option<&'a Bound<'py, PyAny>>,
    output_weight: Option<&'a Bound<'py, PyAny>>,
    tenant_weights: Option<&'a Bound<'py, PyAny>>,
    output_estimate: Option<&'a Bound<'py, PyAny>>,
    max_tenants: Option<&'a Bound<'py, PyAny>>,
    scale_up_limit: Option<&'a Bound<'py, PyAny>>,
    policy: Option<&'a Bound<'py, PyAny>>,
}

/// The flow control `a` asks for (`None`: `queue_limit=0`, off).
fn flow_config(a: FlowArgs<'_, '_>) -> PyResult<Option<FlowControlConfig>> {
    let limit = u32_arg(a.queue_limit, "queue_limit")?;
    if limit == 0 {
        return Ok(None);
    }
    let mut queue = FlowConfig::new(limit);
    queue.queue_tokens = opt_u64_arg(a.queue_tokens, "queue_tokens")?;
    if let Some(d) = a.deadline.filter(|d| !d.is_none()) {
        queue.deadline = seconds_arg(d, "deadline")?;
    }
    if let Some(w) = a.prompt_weight.filter(|w| !w.is_none()) {
        queue.prompt_weight = f64_arg(w, "prompt_weight")?;
    }
    if let Some(w) = a.output_weight.filter(|w| !w.is_none()) {
        queue.output_weight = f64_arg(w, "output_weight")?;
    }
    if let Some(n) = opt_u64_arg(a.output_estimate, "output_estimate")? {
        queue.output_estimate = n;
    }
    if let Some(n) = opt_u64_arg(a.max_tenants, "max_tenants")? {
        queue.max_tenants = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = a.scale_up_limit.filter(|n| !n.is_none()) {
        queue.scale_up_limit = u32_arg(n, "scale_up_limit")?;
    }
    if let Some(map) = a.tenant_weights.filter(|m| !m.is_none()) {
        queue.tenant_weights = weights_arg(map, queue.max_tenants)?;
    }
    let (policy, _) = select_args(a.policy.filter(|p| !p.is_none()), None)?;
    Ok(Some(FlowControlConfig { queue, policy }))
}

/// `tenant_weights`: a mapping of tenant ids to numbers.
fn weights_arg(obj: &Bound<'_, PyAny>, most: usize) -> PyResult<Vec<(String, f64)>> {
    let map = obj
        .cast::<PyMapping>()
        .map_err(|_| PyValueError::new_err("tenant_weights must be a mapping of str to number"))?;
    if map.len()? > most {
        return Err(PyValueError::new_err(format!(
            "tenant_weights has more than max_tenants ({most}) entries"
        )));
    }
    let mut out = Vec::new();
    for item in map.items()?.try_iter()? {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        let name = str_ref(&k, "a tenant_weights key")?.to_owned();
        let w = f64_arg(&v, "a tenant weight")?;
        out.push((name, w));
    }
    Ok(out)
}

fn flow_error(e: loadgate::monitor::FlowError) -> PyErr {
    match e {
        loadgate::monitor::FlowError::Model(t) => threshold_error(t),
        loadgate::monitor::FlowError::Config(c) => PyValueError::new_err(c.to_string()),
    }
}

/// The exception for a refused dispatch, with the queue's `Retry-After`.
fn rejection(py: Python<'_>, e: FlowRejection, retry: Option<Duration>) -> PyErr {
    let Some(reason) = e.reason() else {
        return PyValueError::new_err(e.to_string());
    };
    let made = (|| {
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "reason"), reason.as_str())?;
        if let Some(r) = retry {
            kwargs.set_item(intern!(py, "retry_after"), r.as_secs_f64())?;
        }
        rejection_class(py, reason)?.call((), Some(&kwargs))
    })();
    match made {
        Ok(value) => PyErr::from_value(value),
        Err(err) => err,
    }
}

/// `monitor.dispatch(...)`: awaitable once (`loadgate._flow._drive`).
#[pyclass(frozen, module = "loadgate", name = "_FlowDispatch")]
pub struct FlowDispatch {
    state: Mutex<Await>,
}

enum Await {
    /// Decided at once.
    Ready(Outcome),
    /// Waiting: the future the callback settles, and the request's handle.
    Waiting(Py<PyAny>, DispatchHandle),
    /// Awaited.
    Taken,
}

#[pymethods]
impl FlowDispatch {
    fn __await__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        static DRIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let py = slf.py();
        DRIVE
            .import(py, "loadgate._flow", "_drive")?
            .call1((slf,))?
            .call_method0(intern!(py, "__await__"))
    }

    /// `(True, ticket)` if it was sent at once (raises if it was refused
    /// at once), else `(False, future)`, the asyncio future to await;
    /// raises if awaited before.
    fn _start(&self, py: Python<'_>) -> PyResult<(bool, Py<PyAny>)> {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, Await::Taken) {
            Await::Ready(Ok(ticket)) => Ok((true, ticket.into_any())),
            Await::Ready(Err(e)) => Err(e),
            Await::Waiting(fut, handle) => {
                let awaited = fut.clone_ref(py);
                *state = Await::Waiting(fut, handle);
                Ok((false, awaited))
            }
            Await::Taken => Err(PyRuntimeError::new_err("this dispatch was already awaited")),
        }
    }

    /// Gives the request up: whether it still waited (it left the queue).
    /// `False` when its outcome was decided: then it is on its way to the
    /// future, and `_settle` completes a ticket nobody takes.
    fn _cancel(&self) -> bool {
        match std::mem::replace(&mut *lock(&self.state), Await::Taken) {
            Await::Waiting(_, handle) => handle.cancel(),
            _ => false,
        }
    }
}

impl Drop for FlowDispatch {
    fn drop(&mut self) {
        // Never awaited: the request leaves the queue.
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Await::Waiting(_, handle) = state {
            handle.cancel();
        }
    }
}

/// A request sent to a worker: `worker`, `report_output(tokens)`,
/// `prefill_done()` and `complete(output_tokens)`. Completing (or
/// `async with`'s exit, or garbage collection) releases its booking and
/// settles its tenant's tokens.
#[pyclass(frozen, module = "loadgate", name = "_FlowTicket")]
pub struct FlowTicket {
    worker: u64,
    dp_rank: u32,
    dispatch: Mutex<Option<Dispatch>>,
}

impl FlowTicket {
    fn new(d: Dispatch) -> Self {
        Self {
            worker: d.worker_id(),
            dp_rank: d.dp_rank(),
            dispatch: Mutex::new(Some(d)),
        }
    }

    /// Completes it with the output reported so far.
    fn complete_now(&self) {
        lock(&self.dispatch).take();
    }
}

#[pymethods]
impl FlowTicket {
    /// The worker the request was sent to.
    #[getter]
    fn worker(&self) -> u64 {
        self.worker
    }

    /// The data-parallel rank it was booked on.
    #[getter]
    fn dp_rank(&self) -> u32 {
        self.dp_rank
    }

    /// `n` more KV blocks of generated output, booked on its worker.
    fn add_output_blocks(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = u64_arg(n, "n")?;
        if let Some(d) = lock(&self.dispatch).as_mut() {
            d.add_output_blocks(n);
        }
        Ok(())
    }

    /// `tokens` more output tokens: charged to the tenant at once.
    fn report_output(&self, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = u64_arg(tokens, "tokens")?;
        if let Some(d) = lock(&self.dispatch).as_mut() {
            d.report_output(n);
        }
        Ok(())
    }

    /// One chunk of the streamed response went out: while no output is
    /// reported, it streams the booking as one token (the first as the
    /// first token), for the SLO's observations and the answer's
    /// reservation.
    fn chunk(&self) {
        if let Some(d) = lock(&self.dispatch).as_mut() {
            d.chunk();
        }
    }

    /// The first token came: the prompt stops counting as prefill.
    fn prefill_done(&self) {
        if let Some(d) = lock(&self.dispatch).as_mut() {
            d.prefill_done();
        }
    }

    /// The request finished with `output_tokens` in all (default: what was
    /// reported, or else the chunks streamed). Idempotent.
    #[pyo3(signature = (output_tokens = None))]
    fn complete(&self, output_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let n = opt_u64_arg(output_tokens, "output_tokens")?;
        if let Some(d) = lock(&self.dispatch).take() {
            let total = n.unwrap_or_else(|| d.reported_output());
            d.complete(total);
        }
        Ok(())
    }

    /// Whether it was completed.
    #[getter]
    fn completed(&self) -> bool {
        lock(&self.dispatch).is_none()
    }

    fn __repr__(&self) -> String {
        let state = if self.completed() {
            "completed"
        } else {
            "running"
        };
        format!("<loadgate.FlowTicket worker={} {state}>", self.worker)
    }
}

/// A request's flow-control headers (`loadgate::http::FlowHeaders`): the
/// raw values of its tenant's, deadline and queue headers (`None` where
/// absent) as `(tenant, deadline in seconds, may wait)`; `ValueError` names
/// a malformed one.
#[pyfunction]
pub fn _flow_headers(
    tenant: Option<&[u8]>,
    deadline_ms: Option<&[u8]>,
    queue: Option<&[u8]>,
) -> PyResult<(Option<String>, Option<f64>, Option<bool>)> {
    let h = loadgate::http::FlowHeaders::parse(tenant, deadline_ms, queue)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((
        h.tenant.map(str::to_owned),
        h.deadline.map(|d| d.as_secs_f64()),
        h.queue,
    ))
}
