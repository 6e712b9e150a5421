//! `loadgate.AdmissionGate`, `loadgate.Permit` and `loadgate.Admission`: the
//! worker half.
//!
//! # asyncio without polling
//!
//! `await gate.admit()` registers a callback with the core
//! ([`loadgate::AdmissionGate::admit_with_callback`]) and awaits an asyncio
//! future. The core calls the callback exactly once, from whichever thread
//! granted, expired or closed the request:
//!
//! * while the registering call is still running (admitted or rejected at
//!   once, or granted by another thread in the meantime), the callback only
//!   stores the outcome and the registering call settles the future itself;
//! * on the loop's own thread (a release, `set_limit`, `close` or `expire`
//!   called from a task), it settles the future directly;
//! * on any other thread, it hands the outcome to the loop with
//!   `loop.call_soon_threadsafe`.
//!
//! Cancelling the awaiting task cancels the future, whose done-callback
//! cancels the core ticket, which frees the queue place at once. If the
//! ticket was already granted, the permit is in flight to the future and is
//! released when it arrives and finds the future cancelled. Queue deadlines
//! are driven by a `loop.call_later` timer per waiter, set to its priority
//! class's deadline, that calls [`loadgate::AdmissionGate::expire`]; no
//! thread is started.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Duration;

use loadgate::gate::MAX_CLASSES;
use loadgate::{
    AdmitError, CallbackTicket, ClassConfig, GateConfig, OwnedPermit, Reason, TryAdmitError,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::errors::{
    admit_error, admit_value, config_error, is_integer, opt_str_arg, priority_arg, ranged_arg,
    rejection, seconds_arg, timeout_arg, u32_arg,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A worker's admission gate: at most `limit` requests run and at most
/// `queue` wait; the rest are rejected with `AtCapacity`.
///
/// `classes` gives the gate priority classes, class 0 the most important
/// (1 to 8; without it the gate has one class): an int `n` for `n` classes
/// that may each fill the whole queue, with the gate's `queue_timeout` and
/// no reserved slots, or a sequence of `PriorityClass`, one per class. A
/// freed slot goes to the oldest waiter of the most important class that
/// has one (and may use the slot); an arrival that finds the whole queue
/// full displaces the newest waiter of the least important class below its
/// own, which raises `Displaced`. A request names its class with the
/// `priority` argument of `admit`, `try_admit` and `admit_blocking` (0 to
/// 255; a priority past the last class counts as the last).
#[pyclass(frozen, module = "loadgate")]
pub struct AdmissionGate {
    inner: Arc<loadgate::AdmissionGate>,
    /// Each class's queue deadline, for the asyncio waiters' timers (the
    /// core keeps its own copy and does the expiring).
    timeouts: Box<[Option<Duration>]>,
}

impl AdmissionGate {
    fn build(config: GateConfig) -> PyResult<Self> {
        let timeouts = if config.classes.is_empty() {
            vec![config.queue_timeout].into_boxed_slice()
        } else {
            config.classes.iter().map(|c| c.queue_timeout).collect()
        };
        let inner = loadgate::AdmissionGate::new(config).map_err(config_error)?;
        Ok(Self {
            inner: Arc::new(inner),
            timeouts,
        })
    }

    /// The queue deadline of the class `priority` names: as the core reads
    /// it, one past the last class is the last.
    fn class_timeout(&self, priority: u8) -> Option<Duration> {
        let last = self.timeouts.len() - 1;
        self.timeouts[usize::from(priority).min(last)]
    }
}

/// One priority class of an `AdmissionGate` (its `classes` argument), the
/// core's `ClassConfig` with the gate's settings as defaults:
///
/// * `queue`: how many requests of the class may wait, at most the gate's
///   `queue`; `None` (default): the whole queue; 0: the class never waits
///   (it is admitted when a slot is free for it and rejected otherwise).
/// * `queue_timeout`: seconds its requests may wait before `QueueTimeout`;
///   `None` (default): the gate's `queue_timeout` (no deadline when the gate
///   has none). To mix classes with and without a deadline, leave the
///   gate's unset and give each class its own.
/// * `reserved`: the last `reserved` of the gate's `limit` slots go only to
///   this class and more important ones (at most `limit`; default 0).
#[pyclass(frozen, eq, hash, module = "loadgate")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PriorityClass {
    queue: Option<u32>,
    queue_timeout: Option<Duration>,
    reserved: u32,
}

impl PriorityClass {
    /// The core class, `default` (the class `GateConfig::with_classes`
    /// makes) supplying what is `None`.
    fn config(&self, default: ClassConfig) -> ClassConfig {
        ClassConfig {
            queue: self.queue.unwrap_or(default.queue),
            queue_timeout: self.queue_timeout.or(default.queue_timeout),
            reserved: self.reserved,
        }
    }
}

#[pymethods]
impl PriorityClass {
    #[new]
    #[pyo3(
        signature = (*, queue = None, queue_timeout = None, reserved = None),
        text_signature = "(*, queue=None, queue_timeout=None, reserved=0)"
    )]
    fn new(
        queue: Option<&Bound<'_, PyAny>>,
        queue_timeout: Option<&Bound<'_, PyAny>>,
        reserved: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            queue: queue
                .filter(|q| !q.is_none())
                .map(|q| u32_arg(q, "queue"))
                .transpose()?,
            queue_timeout: queue_timeout
                .filter(|t| !t.is_none())
                .map(|t| seconds_arg(t, "queue_timeout"))
                .transpose()?,
            reserved: reserved.map_or(Ok(0), |r| u32_arg(r, "reserved"))?,
        })
    }

    /// How many of the class may wait, or `None` for the gate's whole queue.
    #[getter]
    fn queue(&self) -> Option<u32> {
        self.queue
    }

    /// The class's queue deadline in seconds, or `None` for the gate's.
    #[getter]
    fn queue_timeout(&self) -> Option<f64> {
        self.queue_timeout.map(|d| d.as_secs_f64())
    }

    /// Slots reserved for this class and more important ones.
    #[getter]
    fn reserved(&self) -> u32 {
        self.reserved
    }

    fn __repr__(&self) -> String {
        let show = |v: Option<String>| v.unwrap_or_else(|| "None".to_owned());
        format!(
            "PriorityClass(queue={}, queue_timeout={}, reserved={})",
            show(self.queue.map(|q| q.to_string())),
            show(self.queue_timeout.map(|d| format!("{:?}", d.as_secs_f64()))),
            self.reserved
        )
    }
}

/// Applies the `classes` argument to `config` (whose queue size and
/// deadline are set: the classes copy them by default).
fn with_classes_arg(
    config: GateConfig,
    classes: Option<&Bound<'_, PyAny>>,
) -> PyResult<GateConfig> {
    let Some(obj) = classes.filter(|c| !c.is_none()) else {
        return Ok(config);
    };
    let want = "an int or a sequence of loadgate.PriorityClass";
    let max = MAX_CLASSES as u64;
    if is_integer(obj) {
        let n = ranged_arg(obj, "classes", 1, max)?;
        return Ok(config.with_classes(n as usize));
    }
    let not_a_sequence = || {
        let got = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        PyTypeError::new_err(format!("classes must be {want}, not {got}"))
    };
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(not_a_sequence());
    }
    let iter = obj.try_iter().map_err(|_| not_a_sequence())?;
    let mut given = Vec::new();
    // Reads one past the most a gate may have, never an endless iterator.
    for item in iter.take(MAX_CLASSES + 1) {
        let item = item?;
        let class = item.cast::<PriorityClass>().map_err(|_| {
            let got = item
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            PyTypeError::new_err(format!(
                "classes[{}] must be a loadgate.PriorityClass, not {got}",
                given.len()
            ))
        })?;
        given.push(*class.get());
    }
    if given.is_empty() || given.len() > MAX_CLASSES {
        let count = if given.is_empty() {
            "no entries".to_owned()
        } else {
            format!("more than {MAX_CLASSES} entries")
        };
        return Err(PyValueError::new_err(format!(
            "classes has {count}: a gate has 1 to {MAX_CLASSES} priority classes"
        )));
    }
    let mut config = config.with_classes(given.len());
    for (index, class) in given.iter().enumerate() {
        let default = config.classes[index];
        config = config.with_class(index, class.config(default));
    }
    Ok(config)
}

fn bool_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<bool> {
    match obj {
        None => Ok(false),
        Some(o) => o
            .cast::<PyBool>()
            .map(|b| b.is_true())
            .map_err(|_| PyTypeError::new_err(format!("{name} must be a bool"))),
    }
}

#[pymethods]
impl AdmissionGate {
    #[new]
    #[pyo3(
        signature = (limit, queue = None, *, wait_limit = None, queue_timeout = None, adaptive_lifo = None, metrics_prefix = None, classes = None),
        text_signature = "(limit, queue=16, *, wait_limit=None, queue_timeout=None, adaptive_lifo=False, metrics_prefix='dynamo', classes=None)"
    )]
    fn new(
        limit: &Bound<'_, PyAny>,
        queue: Option<&Bound<'_, PyAny>>,
        wait_limit: Option<&Bound<'_, PyAny>>,
        queue_timeout: Option<&Bound<'_, PyAny>>,
        adaptive_lifo: Option<&Bound<'_, PyAny>>,
        metrics_prefix: Option<&Bound<'_, PyAny>>,
        classes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut config = GateConfig::new(u32_arg(limit, "limit")?);
        if let Some(q) = queue {
            config.queue = u32_arg(q, "queue")?;
        }
        if let Some(w) = wait_limit.filter(|w| !w.is_none()) {
            config.wait_limit = Some(u32_arg(w, "wait_limit")?);
        }
        if let Some(t) = queue_timeout.filter(|t| !t.is_none()) {
            config.queue_timeout = Some(seconds_arg(t, "queue_timeout")?);
        }
        config.adaptive_lifo = bool_arg(adaptive_lifo, "adaptive_lifo")?;
        if let Some(p) = opt_str_arg(metrics_prefix, "metrics_prefix")? {
            config.metrics_prefix = p.to_string();
        }
        Self::build(with_classes_arg(config, classes)?)
    }

    /// A gate configured from the environment: the engine request limit
    /// `limit`, or when it is `None` the variable
    /// `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT` (older name
    /// `DYN_ENGINE_REQUEST_LIMIT`); the queue size from
    /// `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT` (older name
    /// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`; default 16, 0 = no queue) and the
    /// queue deadline from `DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS` (off when
    /// unset) and the wait limit from `DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT`
    /// (none when unset). The newer name wins; an invalid value of either raises
    /// `ValueError` naming the variable, and so does a missing limit.
    /// `classes` is as for the constructor (the classes copy the queue size
    /// and deadline read from the environment).
    #[classmethod]
    #[pyo3(signature = (limit = None, *, classes = None))]
    fn from_env(
        _cls: &Bound<'_, PyType>,
        limit: Option<&Bound<'_, PyAny>>,
        classes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config = match limit.filter(|l| !l.is_none()) {
            Some(limit) => GateConfig::from_env(u32_arg(limit, "limit")?),
            None => GateConfig::from_env_all(),
        }
        .map_err(config_error)?;
        Self::build(with_classes_arg(config, classes)?)
    }

    /// Takes a slot only if one is free now within the share of class
    /// `priority` and nobody of that class or a more important one is
    /// waiting; `None` otherwise. Raises `Closed` on a closed gate.
    #[pyo3(signature = (*, priority = None), text_signature = "(self, *, priority=0)")]
    fn try_admit(
        &self,
        py: Python<'_>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Permit>> {
        let priority = priority_arg(priority)?;
        match self.inner.try_admit_owned_at(priority) {
            Ok(p) => Ok(Some(Permit::new(p))),
            Err(TryAdmitError::WouldWait) => Ok(None),
            Err(TryAdmitError::Closed) => Err(rejection(py, Reason::Closed)),
        }
    }

    /// An awaitable admission of class `priority`: `permit = await
    /// gate.admit()` or `async with gate.admit() as permit:`. Resolves to a
    /// `Permit`, or raises `AtCapacity`, `QueueTimeout`, `Displaced` or
    /// `Closed`.
    #[pyo3(signature = (*, priority = None), text_signature = "(self, *, priority=0)")]
    fn admit(&self, priority: Option<&Bound<'_, PyAny>>) -> PyResult<Admission> {
        let priority = priority_arg(priority)?;
        Ok(Admission {
            gate: Arc::clone(&self.inner),
            priority,
            timeout: self.class_timeout(priority),
            future: Mutex::new(None),
        })
    }

    /// Waits for a slot for a request of class `priority`, blocking this
    /// thread (the GIL is released while it waits), for at most `timeout`
    /// seconds (`None`: as long as it takes). Raises `AtCapacity`,
    /// `QueueTimeout` (deadline or `timeout` reached), `Displaced` or
    /// `Closed`.
    #[pyo3(
        signature = (timeout = None, *, priority = None),
        text_signature = "(self, timeout=None, *, priority=0)"
    )]
    fn admit_blocking(
        &self,
        py: Python<'_>,
        timeout: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Permit> {
        let timeout = timeout_arg(timeout, "timeout")?;
        let priority = priority_arg(priority)?;
        // A free slot needs no wait, so no GIL round trip.
        match self.inner.try_admit_owned_at(priority) {
            Ok(p) => return Ok(Permit::new(p)),
            Err(TryAdmitError::Closed) => return Err(rejection(py, Reason::Closed)),
            Err(TryAdmitError::WouldWait) => {}
        }
        let gate = Arc::clone(&self.inner);
        py.detach(move || gate.admit_blocking_owned_at(priority, timeout))
            .map(Permit::new)
            .map_err(|e| admit_error(py, e))
    }

    /// Changes the engine limit: raising it admits waiters at once; lowering
    /// it revokes no running permit.
    fn set_limit(&self, limit: &Bound<'_, PyAny>) -> PyResult<()> {
        let limit = u32_arg(limit, "limit")?;
        self.inner.set_limit(limit).map_err(config_error)
    }

    /// Rejects every waiter and every later admission with `Closed`. Permits
    /// already held stay valid.
    fn close(&self) {
        self.inner.close();
    }

    /// Rejects the waiters whose queue deadline has come; returns how many.
    fn expire(&self) -> usize {
        self.inner.expire()
    }

    /// Engine slots `N`.
    #[getter]
    fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// Queue size `Q`.
    #[getter]
    fn queue_limit(&self) -> u32 {
        self.inner.queue_limit()
    }

    /// Wait limit `W` (admitted requests without their first response), or
    /// `None`.
    #[getter]
    fn wait_limit(&self) -> Option<u32> {
        self.inner.wait_limit()
    }

    /// Admitted requests without their first response now (0 without a
    /// wait limit).
    #[getter]
    fn waiting(&self) -> u32 {
        self.inner.waiting()
    }

    /// Slots held now.
    #[getter]
    fn running(&self) -> u32 {
        self.inner.running()
    }

    /// Requests waiting now.
    #[getter]
    fn queued(&self) -> u32 {
        self.inner.queued()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The gate's queue deadline in seconds, or `None` (the classes' own
    /// may differ; this is what they copy by default).
    #[getter]
    fn queue_timeout(&self) -> Option<f64> {
        self.inner.queue_timeout().map(|d| d.as_secs_f64())
    }

    /// How many priority classes the gate has (1 without classes).
    #[getter]
    fn classes(&self) -> usize {
        self.inner.classes()
    }

    /// A snapshot of the gauges and counters, with `classes`: one dict per
    /// priority class (class 0 first) of its `queued`, `queue_limit`,
    /// `rejected_at_capacity`, `expired`, `rejected_closed` and `displaced`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("running", s.running)?;
        d.set_item("queued", s.queued)?;
        d.set_item("limit", s.limit)?;
        d.set_item("queue_limit", s.queue_limit)?;
        d.set_item("waiting", s.waiting)?;
        d.set_item("wait_limit", s.wait_limit)?;
        d.set_item("closed", s.closed)?;
        d.set_item("received", s.received)?;
        d.set_item("admitted_direct", s.admitted_direct)?;
        d.set_item("admitted_queued", s.admitted_queued)?;
        d.set_item("rejected_at_capacity", s.rejected_at_capacity)?;
        d.set_item("rejected_closed", s.rejected_closed)?;
        d.set_item("expired", s.expired)?;
        d.set_item("cancelled", s.cancelled)?;
        d.set_item("displaced", s.displaced)?;
        let classes = PyList::empty(py);
        for c in s.classes() {
            let cd = PyDict::new(py);
            cd.set_item("queued", c.queued)?;
            cd.set_item("queue_limit", c.queue_limit)?;
            cd.set_item("rejected_at_capacity", c.rejected_at_capacity)?;
            cd.set_item("expired", c.expired)?;
            cd.set_item("rejected_closed", c.rejected_closed)?;
            cd.set_item("displaced", c.displaced)?;
            classes.append(cd)?;
        }
        d.set_item("classes", classes)?;
        Ok(d)
    }

    /// The worker metrics in Prometheus text format.
    fn metrics_text(&self) -> String {
        self.inner.metrics_text()
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        let classes = match s.class_count {
            1 => String::new(),
            n => format!(" classes={n}"),
        };
        format!(
            "<loadgate.AdmissionGate limit={} queue_limit={}{classes} running={} queued={}{}>",
            s.limit,
            s.queue_limit,
            s.running,
            s.queued,
            if s.closed { " closed" } else { "" }
        )
    }
}

/// A held engine slot. `release()` gives it back (idempotent); so do
/// leaving a `with` block and garbage collection.
#[pyclass(frozen, freelist = 64, module = "loadgate")]
pub struct Permit {
    inner: Mutex<Option<OwnedPermit>>,
}

impl Permit {
    fn new(p: OwnedPermit) -> Self {
        Self {
            inner: Mutex::new(Some(p)),
        }
    }

    fn take(&self) -> Option<OwnedPermit> {
        lock(&self.inner).take()
    }
}

#[pymethods]
impl Permit {
    /// Gives the slot back (to the oldest waiter, if any). Calling it again
    /// does nothing.
    fn release(&self) {
        drop(self.take());
    }

    /// Marks the request's first response: on a gate with a wait limit,
    /// gives back the wait slot (to the oldest waiter, if a request slot is
    /// free too); the request slot stays held until `release()`.
    /// Idempotent, from any thread; a no-op after `release()` or on a gate
    /// without a wait limit.
    fn first_response(&self) {
        if let Some(p) = lock(&self.inner).as_ref() {
            p.first_response();
        }
    }

    /// Whether the slot was given back.
    #[getter]
    fn released(&self) -> bool {
        lock(&self.inner).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        if self.released() {
            "<loadgate.Permit released>".to_owned()
        } else {
            "<loadgate.Permit held>".to_owned()
        }
    }
}

/// `asyncio.get_running_loop()`.
fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
}

/// One pending `await gate.admit()`: `await` it once, or use it with
/// `async with` (the permit is released when the block ends).
#[pyclass(frozen, module = "loadgate")]
pub struct Admission {
    gate: Arc<loadgate::AdmissionGate>,
    /// The request's priority class.
    priority: u8,
    /// That class's queue deadline.
    timeout: Option<Duration>,
    /// The asyncio future, once awaited.
    future: Mutex<Option<Py<PyAny>>>,
}

/// Where the outcome of a callback admission goes.
enum Delivery {
    /// `start` is still running: keep the outcome for it.
    Registering(Option<Result<OwnedPermit, AdmitError>>),
    /// Queued: settle this waiter's future.
    Waiting(Py<Waiter>),
    /// Settled.
    Done,
}

/// The core callback: store, settle, or hand over to the loop.
fn deliver(shared: &Mutex<Delivery>, outcome: Result<OwnedPermit, AdmitError>) {
    let mut d = lock(shared);
    match std::mem::replace(&mut *d, Delivery::Done) {
        Delivery::Registering(_) => *d = Delivery::Registering(Some(outcome)),
        Delivery::Waiting(waiter) => {
            drop(d);
            Python::attach(|py| waiter.get().deliver(py, outcome));
        }
        Delivery::Done => {}
    }
}

impl Admission {
    /// Registers the request and returns the asyncio future it resolves.
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut slot = lock(&self.future);
        if slot.is_some() {
            return Err(PyRuntimeError::new_err(
                "this admission was already awaited; call gate.admit() again",
            ));
        }
        let event_loop = running_loop(py)?;
        let fut = event_loop.call_method0(intern!(py, "create_future"))?;
        *slot = Some(fut.clone().unbind());
        drop(slot);

        let waiter = Bound::new(
            py,
            Waiter {
                gate: Arc::clone(&self.gate),
                fut: fut.clone().unbind(),
                event_loop: event_loop.clone().unbind(),
                thread: thread::current().id(),
                ticket: Mutex::new(None),
                timer: Mutex::new(None),
            },
        )?;
        let shared = Arc::new(Mutex::new(Delivery::Registering(None)));
        let for_callback = Arc::clone(&shared);
        let ticket = self.gate.admit_with_callback_at(
            self.priority,
            Box::new(move |outcome| deliver(&for_callback, outcome)),
        );

        // Admitted or rejected at once: settle now, no timer, no callback.
        let immediate = matches!(&*lock(&shared), Delivery::Registering(Some(_)));
        if !immediate {
            // Queued: wire up cancellation and the queue deadline first
            // (nothing else can reach the future yet), then publish.
            *lock(&waiter.get().ticket) = Some(ticket);
            fut.call_method1(
                intern!(py, "add_done_callback"),
                (waiter.getattr(intern!(py, "_on_done"))?,),
            )?;
            if let Some(timeout) = self.timeout {
                waiter.get().arm_timer(py, &waiter, timeout)?;
            }
        }
        let outcome = {
            let mut d = lock(&shared);
            match std::mem::replace(&mut *d, Delivery::Done) {
                Delivery::Registering(Some(outcome)) => Some(outcome),
                _ => {
                    *d = Delivery::Waiting(waiter.clone().unbind());
                    None
                }
            }
        };
        if let Some(outcome) = outcome {
            waiter.get().deliver(py, outcome);
        }
        Ok(fut)
    }
}

#[pymethods]
impl Admission {
    fn __await__(&self, py: Python<'_>) -> PyResult<AdmissionAwait> {
        AdmissionAwait::new(py, self.start(py)?)
    }

    fn __aenter__(&self, py: Python<'_>) -> PyResult<AdmissionAwait> {
        AdmissionAwait::new(py, self.start(py)?)
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<Ready> {
        let fut = lock(&self.future).as_ref().map(|f| f.clone_ref(py));
        if let Some(fut) = fut {
            let fut = fut.bind(py);
            let done = fut.call_method0(intern!(py, "done"))?.is_truthy()?;
            if done
                && !fut.call_method0(intern!(py, "cancelled"))?.is_truthy()?
                && fut.call_method0(intern!(py, "exception"))?.is_none()
            {
                let permit = fut.call_method0(intern!(py, "result"))?;
                if let Ok(p) = permit.cast::<Permit>() {
                    p.get().release();
                }
            }
        }
        Ok(Ready)
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.future).is_some() {
            "awaited"
        } else {
            "not awaited"
        };
        format!("<loadgate.Admission {state}>")
    }
}

/// The iterator behind `await admission`: the future's own iterator, except
/// that an exception thrown into it (the awaiting task was cancelled, or
/// the coroutine closed) while the future already holds a permit releases
/// that permit, since nobody will receive it.
#[pyclass(frozen, module = "loadgate", name = "_AdmissionAwait")]
pub struct AdmissionAwait {
    fut: Py<PyAny>,
    iter: Py<PyAny>,
}

impl AdmissionAwait {
    fn new(py: Python<'_>, fut: Bound<'_, PyAny>) -> PyResult<Self> {
        let iter = fut.call_method0(intern!(py, "__await__"))?.unbind();
        Ok(Self {
            fut: fut.unbind(),
            iter,
        })
    }

    /// Releases a permit the future holds that will never be delivered.
    fn release_unclaimed(&self, py: Python<'_>) -> PyResult<()> {
        let fut = self.fut.bind(py);
        if fut.call_method0(intern!(py, "done"))?.is_truthy()?
            && !fut.call_method0(intern!(py, "cancelled"))?.is_truthy()?
            && fut.call_method0(intern!(py, "exception"))?.is_none()
        {
            let value = fut.call_method0(intern!(py, "result"))?;
            release_value(&value, true);
        }
        Ok(())
    }
}

#[pymethods]
impl AdmissionAwait {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.iter.bind(py).call_method0(intern!(py, "__next__"))
    }

    fn send<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.iter
            .bind(py)
            .call_method1(intern!(py, "send"), (value,))
    }

    #[pyo3(signature = (*args))]
    fn throw<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.release_unclaimed(py)?;
        self.iter.bind(py).call_method1(intern!(py, "throw"), args)
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.release_unclaimed(py)?;
        self.iter.bind(py).call_method0(intern!(py, "close"))?;
        Ok(())
    }
}

/// An awaitable that is already done (what `__aexit__` returns).
#[pyclass(frozen, module = "loadgate", name = "_Ready")]
pub struct Ready;

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self) -> Option<bool> {
        None
    }
}

/// The loop-side state of one queued admission.
#[pyclass(frozen, module = "loadgate", name = "_AdmissionWaiter")]
pub struct Waiter {
    gate: Arc<loadgate::AdmissionGate>,
    fut: Py<PyAny>,
    event_loop: Py<PyAny>,
    thread: ThreadId,
    ticket: Mutex<Option<CallbackTicket>>,
    timer: Mutex<Option<Py<PyAny>>>,
}

impl Waiter {
    /// Routes an outcome to the future: directly on the loop's thread,
    /// through `call_soon_threadsafe` from any other.
    fn deliver(&self, py: Python<'_>, outcome: Result<OwnedPermit, AdmitError>) {
        let (value, ok) = match outcome {
            Ok(p) => match Bound::new(py, Permit::new(p)) {
                Ok(p) => (p.into_any(), true),
                Err(e) => return e.write_unraisable(py, None),
            },
            Err(e) => match admit_value(py, e) {
                Ok(v) => (v, false),
                Err(e) => return e.write_unraisable(py, None),
            },
        };
        if thread::current().id() == self.thread {
            self.settle_with(py, &value, ok);
            return;
        }
        let handed = Bound::new(
            py,
            Settle {
                fut: self.fut.clone_ref(py),
            },
        )
        .and_then(|settle| {
            self.event_loop.bind(py).call_method1(
                intern!(py, "call_soon_threadsafe"),
                (settle, value.clone(), ok),
            )
        });
        if handed.is_err() {
            // The loop is closed: nobody will take the slot.
            release_value(&value, ok);
        }
    }

    fn settle_with(&self, py: Python<'_>, value: &Bound<'_, PyAny>, ok: bool) {
        settle(py, self.fut.bind(py), value, ok);
    }

    /// Schedules `expire()` at this waiter's queue deadline.
    fn arm_timer(&self, py: Python<'_>, me: &Bound<'_, Waiter>, delay: Duration) -> PyResult<()> {
        let handle = self.event_loop.bind(py).call_method1(
            intern!(py, "call_later"),
            (
                delay.as_secs_f64(),
                me.getattr(intern!(py, "_on_deadline"))?,
            ),
        )?;
        *lock(&self.timer) = Some(handle.unbind());
        Ok(())
    }
}

/// Gives back the slot of a permit nobody will receive.
fn release_value(value: &Bound<'_, PyAny>, ok: bool) {
    if ok {
        if let Ok(p) = value.cast::<Permit>() {
            p.get().release();
        }
    }
}

/// Sets the future's result or exception unless it is already done (then a
/// permit is released instead).
fn settle(py: Python<'_>, fut: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>, ok: bool) {
    let done = fut
        .call_method0(intern!(py, "done"))
        .and_then(|d| d.is_truthy())
        .unwrap_or(true);
    if done {
        release_value(value, ok);
        return;
    }
    let method = if ok {
        intern!(py, "set_result")
    } else {
        intern!(py, "set_exception")
    };
    if fut.call_method1(method, (value,)).is_err() {
        // The loop was closed under the future.
        release_value(value, ok);
    }
}

#[pymethods]
impl Waiter {
    /// Done-callback of the future: a cancelled future leaves the queue.
    fn _on_done(&self, py: Python<'_>, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Some(timer) = lock(&self.timer).take() {
            timer.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        let ticket = lock(&self.ticket).take();
        if let Some(ticket) = ticket {
            if fut.call_method0(intern!(py, "cancelled"))?.is_truthy()? {
                // False when the outcome is already on its way; `settle`
                // then releases the permit.
                ticket.cancel();
            }
        }
        Ok(())
    }

    /// Timer at the queue deadline: expire due waiters; re-arm if this one
    /// is still queued (a timer may fire a hair early).
    fn _on_deadline(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<()> {
        let me = slf.get();
        lock(&me.timer).take();
        me.gate.expire();
        let queued = lock(&me.ticket)
            .as_ref()
            .is_some_and(CallbackTicket::is_queued);
        if queued {
            let wait = me
                .gate
                .time_to_next_deadline()
                .unwrap_or_default()
                .max(Duration::from_micros(100));
            me.arm_timer(py, slf, wait)?;
        }
        Ok(())
    }
}

/// `call_soon_threadsafe` target that settles a future on its loop.
#[pyclass(frozen, module = "loadgate", name = "_Settle")]
pub struct Settle {
    fut: Py<PyAny>,
}

#[pymethods]
impl Settle {
    fn __call__(&self, py: Python<'_>, value: &Bound<'_, PyAny>, ok: bool) {
        settle(py, self.fut.bind(py), value, ok);
    }
}
